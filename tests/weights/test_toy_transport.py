"""A new weight transport is one file plus one registry entry: tests/toy_transport.py (numbered
frame files in a directory) trains the tiny model in mode=sync, selected by its "module:ATTR"
path, with the engine holding exactly the trainer's weights after every step; and in
mode=async, registered under a name in one line, with an engine in a spawned process (which
imports the toy's receiver class) ending on the last published weights, hash for hash.
Bad paths fail when the config is built, naming the problem."""

from __future__ import annotations

import pytest

import traingym
from traingym.core.errors import ConfigError
from traingym.observability.events import read_events
from traingym.weights import registry

# tests/ and tests/weights are on sys.path (pytest's prepend import mode); spawned engines
# inherit it, so they import toy_transport by the same name
from test_loop_sync import Watched, _cfg, _check_events  # noqa: E402
from toy_transport import ToyReceiver, ToySender  # noqa: E402


def test_sync_run_over_the_toy_transport_by_path(tmp_path):
    w = Watched(_cfg(transport="toy_transport:TRANSPORT"), tmp_path / "run")
    assert isinstance(w.run.weights.sender, ToySender)
    assert isinstance(w.run.weights.subscriber.receiver, ToyReceiver)
    w.train()
    w.check()  # after every publish the engine held exactly the trainer's weights
    events = _check_events(tmp_path / "run", 0, 3)
    assert [e["sync_codec"] for e in events] == ["delta"] * 3
    assert w.run.weights.subscriber.stats.applied == 4  # the anchor, then one delta per step
    assert not (tmp_path / "run" / "weights").exists()  # its scratch dir is removed on close


def test_async_run_over_the_toy_transport_registered_in_one_line(tmp_path, monkeypatch):
    monkeypatch.setitem(registry.TRANSPORTS.entries, "toy", "toy_transport:TRANSPORT")  # the one line
    cfg = traingym.build_config("tiny", overrides={
        "steps": 3, "mode": "async", "threads": 1, "weights": {"transport": "toy"},
        "async": {"engine_timeout_s": 60.0}, "eval": {"before": False, "after": False}})
    result = traingym.train(cfg, run_dir=tmp_path / "run", progress=False)
    events = read_events(tmp_path / "run")
    assert [e["step"] for e in events] == [1, 2, 3]
    assert all(e["sync_version"] == e["step"] for e in events)
    final = result.final_metrics["async_final_weights"]  # hash-checked against the publisher
    assert [(f["engine"], f["version"]) for f in final] == [(0, 3)]
    assert not (tmp_path / "run" / "weights-engines").exists()


def test_transport_names_and_paths_are_checked_when_the_config_is_built():
    def build(transport, mode="sync"):
        return traingym.build_config("tiny", overrides={"mode": mode,
                                                        "weights": {"transport": transport}})

    with pytest.raises(ConfigError, match="cannot load no_such_module:TRANSPORT"):
        build("no_such_module:TRANSPORT")
    with pytest.raises(ConfigError, match="toy_transport:ToyConfig: is type, not a"):
        build("toy_transport:ToyConfig")
    with pytest.raises(ConfigError, match="give a 'module:ATTR' path"):
        build("toy_transport:")
    with pytest.raises(ConfigError, match=r"unknown weights.transport 'toy'; choose one of \["):
        build("toy")  # not registered in this test
    with pytest.raises(ConfigError, match="must be 'filesystem', 'shm' or 'tcp'"):
        build("inproc", mode="async")  # abilities decide: inproc does not cross processes
    assert build("toy_transport:TRANSPORT", mode="async").weights.transport == \
        "toy_transport:TRANSPORT"
