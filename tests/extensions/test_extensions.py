"""Every seam takes a toy that is one file plus one registry line (or a "module:attr" string
in the config), here or, for the weight transport, tests/toy_transport.py: engine, algorithm (its own knob and metric), env adapter (its own
prefix), metric sink, sandbox backend, weight transport and codec. Each toy trains the tiny
model in a sync run of 2 steps and, where the toy runs in or reaches the engine processes, in
an async run; each test checks the toy was really used, from what the toy itself recorded.
A seam that needed any other edit to take its toy would fail here.

The toys live in the `extensions` package (tests/ is on sys.path, tests/conftest.py), so the
spawned async engine processes import them by the same names; names registered in this process
reach them through the engine spec (core/registry.py snapshot/restore).
"""

from __future__ import annotations

import json
import os
import statistics
from pathlib import Path

import pytest

import traingym
from traingym.algorithms.registry import ALGORITHMS
from traingym.envs.adapters import ADAPTERS
from traingym.observability.events import read_events
from traingym.observability.sinks import SINKS
from traingym.rollout.registry import REGISTRY as ENGINES
from traingym.sandbox import BACKENDS
from traingym.weights.base import CODECS
from traingym.weights.registry import TRANSPORTS

STEPS = 2
ASYNC = {"mode": "async", "weights": {"transport": "filesystem"},
         "async": {"engine_timeout_s": 60.0}}


@pytest.fixture
def register():
    """`register(REGISTRY, name, "module:attr")`: the one line that adds a toy; undone after
    the test (the registries are module-level)."""
    added = []

    def one_line(registry, name, target):
        assert name not in registry.entries, f"{name!r} is already registered"
        registry.register(name, target)
        added.append((registry, name))

    yield one_line
    for registry, name in added:
        registry.entries.pop(name, None)


def _merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def train(tmp_path: Path, *more: dict, **kwargs) -> list[dict]:
    """A tiny run of STEPS steps with `more` merged into its overrides; its step records."""
    over = {"steps": STEPS, "threads": 1, "seed": 0, "eval": {"before": False, "after": False}}
    for m in more:
        over = _merge(over, m)
    cfg = traingym.build_config("tiny", overrides=over)
    result = traingym.train(cfg, run_dir=tmp_path / "run", progress=False, **kwargs)
    events = read_events(tmp_path / "run")
    assert [e["step"] for e in events] == list(range(1, STEPS + 1))
    if over.get("mode") == "async":  # the engine ended on the last published weights
        final = result.final_metrics["async_final_weights"]
        assert [f["version"] for f in final] == [STEPS], final
    return events


def lines(path: Path) -> list[list[str]]:
    return [ln.split() for ln in path.read_text().splitlines()] if path.exists() else []


def samples(tmp_path: Path) -> list[dict]:
    return [json.loads(ln) for ln in (tmp_path / "run" / "samples.jsonl").read_text().splitlines()]


# -- engine ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("mode", ["sync", "async"])
def test_toy_engine(mode, tmp_path, register):
    register(ENGINES, "toy", "extensions.toy_engine:ToyEngine")  # the one line
    log = tmp_path / "engine.log"
    train(tmp_path, {"rollout": {"engine": "toy", "engine_options": {"log_path": str(log)}}},
          ASYNC if mode == "async" else {})
    built = [int(pid) for what, pid, *_ in lines(log) if what == "built"]
    generated = [(int(pid), int(n)) for what, pid, n in
                 (ln for ln in lines(log) if ln[0] == "generate")]
    # its own option reached it, and it generated every trained sample (4 prompts x 4), in
    # this process (sync) or in the spawned engine process (async) that built one
    assert sum(n for _, n in generated) >= STEPS * 16, lines(log)
    pids = {pid for pid, _ in generated}
    assert pids <= set(built)
    assert (pids == {os.getpid()}) == (mode == "sync"), (pids, os.getpid())


# -- algorithm ------------------------------------------------------------------------------------

@pytest.mark.parametrize("mode", ["sync", "async"])
def test_toy_algorithm_knob_and_metric(mode, tmp_path, register):
    register(ALGORITHMS, "toy", "extensions.toy_algorithm:ToyAlgorithm")  # the one line
    scale = 3.0
    events = train(tmp_path, {"algorithm": {"name": "toy", "toy_scale": scale}},
                   ASYNC if mode == "async" else {})
    by_step: dict[int, dict[int, list[float]]] = {}
    for s in samples(tmp_path):  # every group of every step (samples_per_step 4 = prompts)
        by_step.setdefault(s["step"], {}).setdefault(s["group"], []).append(s["reward"])
    for e in events:
        groups = [r for r in by_step[e["step"]].values() if len(set(r)) > 1]  # GRPO drops equal
        grpo = [abs(x - statistics.fmean(r)) for r in groups for x in r]
        assert groups and e["toy_adv_abs_mean"] == pytest.approx(scale * statistics.fmean(grpo))
    with pytest.raises(ValueError, match="toy_scale"):  # its knob is validated as its own
        traingym.build_config("tiny", overrides={"algorithm": {"name": "toy", "toy_scale": -1}})


def test_toy_algorithm_by_path(tmp_path):
    events = train(tmp_path, {"algorithm": {"name": "extensions.toy_algorithm:ToyAlgorithm",
                                            "toy_scale": 2.0}})
    assert all(e["toy_adv_abs_mean"] > 0 for e in events)


# -- env adapter ----------------------------------------------------------------------------------

@pytest.mark.parametrize("mode", ["sync", "async"])
def test_toy_env_adapter(mode, tmp_path, register):
    register(ADAPTERS, "toy", "extensions.toy_env:ADAPTER")  # the one line
    events = train(tmp_path, {"task": {"env": "toy:0123456789"}},
                   ASYNC if mode == "async" else {})
    rows = samples(tmp_path)
    assert rows and all(s["env_info"][0]["toy_env"] == "0123456789" for s in rows)
    pids = {s["env_info"][0]["pid"] for s in rows}
    assert (pids == {os.getpid()}) == (mode == "sync")
    for s in rows:  # its reward: the fraction of digits in the completion
        text = s["completion"]
        assert s["reward"] == pytest.approx(sum(c.isdigit() for c in text) / max(len(text), 1))
    assert all(e["trained_tokens"] > 0 for e in events)


# -- metric sink ----------------------------------------------------------------------------------

def test_toy_sink_registered(tmp_path, register):
    register(SINKS, "toy", "extensions.toy_sink:ToySink")  # the one line
    out = tmp_path / "sink.jsonl"
    events = train(tmp_path, {"observability": {"sinks": ["toy"],
                                                "sink_options": {"toy": {"path": str(out)}}}})
    got = [json.loads(ln) for ln in out.read_text().splitlines()]
    assert [g["step"] for g in got] == [e["step"] for e in events]
    for g, e in zip(got, events):
        assert g["record"]["reward_mean"] == e["reward_mean"]
        assert g["record"]["loss"] == e["loss"]


def test_toy_sink_by_path(tmp_path):
    train(tmp_path, {"observability": {"sinks": ["extensions.toy_sink:ToySink"]}})
    got = (tmp_path / "run" / "toy_sink.jsonl").read_text().splitlines()
    assert [json.loads(ln)["step"] for ln in got] == list(range(1, STEPS + 1))


# -- sandbox backend ------------------------------------------------------------------------------

def tiebreak(samples):
    """Group hook of the async sandbox runs: the sandbox's reward plus 0.01 x the member's
    index, so every group trains. The tiny model's code never passes a test, and an async run
    whose step trains nothing stalls (test_async_run_goes_on_after_a_step_that_trains_nothing);
    not a sandbox matter."""
    return [s.reward + 0.01 * i for i, s in enumerate(samples)]


def _code_run(tmp_path, monkeypatch, backend, *more, group_reward=None):
    from traingym.envs.code_env import CodeEnvMaker
    from traingym.envs.code_problems import code_rows

    log = tmp_path / "sandbox.log"
    monkeypatch.setenv("TOY_SANDBOX_LOG", str(log))  # spawned engine processes inherit it
    train(tmp_path, {"rollout": {"prompts_per_step": 2, "group_size": 2}}, *more,
          dataset=code_rows(0)[:8], env=CodeEnvMaker(backend), group_reward=group_reward)
    ran = lines(log)
    # every sample's program was graded in the toy sandbox (2 steps x 2 prompts x 2)
    assert len(ran) >= STEPS * 4, ran
    assert all(s["env_info"][0]["status"] for s in samples(tmp_path))
    return {int(pid) for pid, *_ in ran}


def test_toy_sandbox_registered_sync(tmp_path, monkeypatch, register):
    register(BACKENDS, "toy", "extensions.toy_sandbox:ToySandbox")  # the one line
    assert _code_run(tmp_path, monkeypatch, "toy") == {os.getpid()}


def test_toy_sandbox_by_path_async(tmp_path, monkeypatch):
    pids = _code_run(tmp_path, monkeypatch, "extensions.toy_sandbox:ToySandbox", ASYNC,
                     group_reward=tiebreak)
    assert os.getpid() not in pids  # graded in the engine process


def test_toy_sandbox_registered_async(tmp_path, monkeypatch, register):
    register(BACKENDS, "toy", "extensions.toy_sandbox:ToySandbox")  # the one line
    pids = _code_run(tmp_path, monkeypatch, "toy", ASYNC, {"async": {"engine_timeout_s": 20.0}},
                     group_reward=tiebreak)
    assert os.getpid() not in pids


def zero_reward(sample) -> float:
    return 0.0


def test_async_run_goes_on_after_a_step_that_trains_nothing(tmp_path):
    """A step that changes no weight keeps the hash; the filesystem transport's reader still
    delivers the versions after it (it stalled here once)."""
    events = train(tmp_path, ASYNC, {"async": {"engine_timeout_s": 10.0},
                                     "task": {"reward": "extensions.test_extensions:zero_reward"}})
    assert all(e["trained_tokens"] == 0 for e in events)


# -- weight transport -----------------------------------------------------------------------------

@pytest.mark.parametrize("mode", ["sync", "async"])
def test_toy_transport(mode, tmp_path, monkeypatch, register):
    register(TRANSPORTS, "toy", "toy_transport:TRANSPORT")  # the one line (tests/toy_transport.py)
    log = tmp_path / "transport.log"
    monkeypatch.setenv("TOY_TRANSPORT_LOG", str(log))
    events = train(tmp_path, ASYNC if mode == "async" else {}, {"weights": {"transport": "toy"}})
    channels: dict[str, dict] = {}  # scratch dir -> what was sent and received over it
    for ln in lines(log):
        ch = channels.setdefault(ln[1], {"send": [], "recv": []})
        ch[ln[0]].append(ln[2:])
    # sync: the trainer's colocated engine; async: the engine process (the trainer keeps a
    # colocated engine too), which took every frame over it in order, from the anchor on
    far = [c for c in channels.values() if {int(r[0]) for r in c["recv"]} - {os.getpid()}]
    assert len(far) == (mode == "async"), channels
    for ch in far or channels.values():
        assert [int(s[0]) for s in ch["send"]] == list(range(len(ch["send"])))
        assert len(ch["send"]) >= STEPS + 1 and ch["send"][0][1] == "full", ch
        assert [int(r[1]) for r in ch["recv"]] == list(range(len(ch["send"]))), ch
    assert events[-1]["sync_version"] == STEPS


# -- weight codec ---------------------------------------------------------------------------------

CODEC_NEEDS = ("weights/sync.py Publisher accepts only codec 'auto'/'delta'/'full' (ValueError "
               "'unknown codec') and always encodes with CODECS.get('delta')/CODECS.get('full'); "
               "it must encode with CODECS.get(cfg.codec) for any other registered codec, and "
               "Subscriber.poll / codecs.apply_changes must decode a payload whose header.codec "
               "is not 'delta' with CODECS.get(header.codec).decode (and cluster/local.py's "
               "publisher likewise); weights/config.py's codec validator must also accept a "
               "'module:Class' path (codec_choices lists registered names only)")


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_toy_codec(mode, tmp_path, monkeypatch, register):
    register(CODECS, "toy_full", "extensions.toy_codec:ToyFullCodec")  # the one line
    log = tmp_path / "codec.log"
    monkeypatch.setenv("TOY_CODEC_LOG", str(log))
    events = train(tmp_path, ASYNC if mode == "async" else {}, {"weights": {"codec": "toy_full"}})
    encoded = [ln for ln in lines(log) if ln[0] == "encode"]
    decoded = [ln for ln in lines(log) if ln[0] == "decode"]
    assert len(encoded) >= STEPS + 1 and {int(e[1]) for e in encoded} == {os.getpid()}
    assert len(decoded) == len(encoded)  # the engine's side decoded every update with it
    assert [e["sync_codec"] for e in events] == ["toy_full"] * STEPS


def test_toy_codec_by_path(tmp_path):
    train(tmp_path, {"weights": {"codec": "extensions.toy_codec:ToyFullCodec"}})
