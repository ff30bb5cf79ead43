"""Sinks (observability/sinks.py): each one read back after a real 2-step tiny run (TensorBoard
through its EventAccumulator, the W&B offline run file record by record, MLflow through
MlflowClient), config-time checks, and a sink that raises: reported once, dropped, the run
goes on."""

import glob
import importlib.util
import json
import math
import struct
import zlib
from pathlib import Path

import pytest
from prereq import missing, require

import traingym
from traingym.core.errors import ConfigError
from traingym.observability import sinks
from traingym.observability.events import read_events

KEYS = ("reward_mean", "loss", "grad_norm", "tokens_per_s")


def _cfg(sink_names, **over):
    return traingym.build_config("tiny", overrides={
        "steps": 2, "threads": 1, "eval": {"before": False, "after": False},
        "observability": {"sinks": sink_names}, **over})


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """One tiny run writing to every sink whose package is installed here."""
    names = [n for n in sinks.SINKS.names()
             if all(importlib.util.find_spec(m) for m in sinks.sink_class(n).requires)]
    if not names:
        missing("no sink package is installed: pip install 'traingym[sinks]'")
    path = tmp_path_factory.mktemp("sinks") / "run"
    traingym.train(_cfg(names), run_dir=path, progress=False)
    return path


def _logged(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    events = read_events(run_dir)
    assert [e["step"] for e in events] == [1, 2]
    return {k: [(e["step"], float(e[k])) for e in events] for k in KEYS}


def test_tensorboard_scalars_read_back(run_dir):
    require("tensorboard", "the TensorBoard sink needs the tensorboard extra")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir / "tensorboard"))
    acc.Reload()
    for key, want in _logged(run_dir).items():
        got = [(e.step, e.value) for e in acc.Scalars(key)]
        assert [s for s, _ in got] == [s for s, _ in want], key
        assert all(math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-12)  # stored as float32
                   for (_, a), (_, b) in zip(got, want)), (key, got, want)
    assert "sync_codec" not in acc.Tags()["scalars"]  # strings are not metrics


def wandb_records(path: Path) -> list[bytes]:
    """The records of a W&B run file (`run-*.wandb`): a 7-byte header (':W&B', magic 0xBEE1,
    version 0), then the LevelDB log format: 32 KiB blocks of chunks, each a 7-byte header
    (crc32 of type byte + data, length, type: 1 full, 2 first, 3 middle, 4 last) and data."""
    raw = path.read_bytes()
    assert raw[:4] == b":W&B" and struct.unpack("<H", raw[4:6])[0] == 0xBEE1, raw[:7]
    records, pending, pos, block = [], b"", 7, 32768
    while pos + 7 <= len(raw):
        if block - pos % block < 7:  # the block's tail is padding
            pos += block - pos % block
            continue
        crc, n, kind = struct.unpack("<IHB", raw[pos:pos + 7])
        if n == 0 and kind == 0:
            break
        data = raw[pos + 7:pos + 7 + n]
        assert zlib.crc32(data, zlib.crc32(bytes([kind]))) & 0xFFFFFFFF == crc, "bad checksum"
        pos += 7 + n
        pending += data
        if kind in (1, 4):
            records.append(pending)
            pending = b""
    return records


def _key(item) -> str:
    """An item's key: `key`, or `nested_key` joined with '/' (W&B writes either)."""
    return item.key or "/".join(item.nested_key)


def test_wandb_offline_run_files_read_back(run_dir):
    require("wandb", "the W&B sink needs the wandb extra")
    from wandb.proto import wandb_internal_pb2

    files = glob.glob(str(run_dir / "wandb" / "offline-run-*" / "run-*.wandb"))
    assert len(files) == 1, files
    history, config = [], {}
    for data in wandb_records(Path(files[0])):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(data)
        kind = record.WhichOneof("record_type")
        if kind == "history":
            history.append({_key(i): json.loads(i.value_json) for i in record.history.item})
        elif kind == "run":  # the run's config comes with it
            config.update({_key(i): json.loads(i.value_json) for i in record.run.config.update})
    for key, want in _logged(run_dir).items():
        got = [(h["step"], h[key]) for h in history if key in h]
        assert [s for s, _ in got] == [s for s, _ in want], key
        assert all(math.isclose(a, b, rel_tol=1e-12) for (_, a), (_, b) in zip(got, want)), key
    assert config["model"]["path"] == "tiny" and config["steps"] == 2, sorted(config)


def test_mlflow_run_read_back_through_its_client(run_dir):
    require("mlflow", "the MLflow sink needs the mlflow extra")
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{run_dir.resolve() / 'mlflow.db'}")
    exp = client.get_experiment_by_name("traingym")
    (run,) = client.search_runs([exp.experiment_id])
    assert run.info.status == "FINISHED" and run.info.run_name == run_dir.name
    assert run.data.params["model.path"] == "tiny"
    for key, want in _logged(run_dir).items():
        got = sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, key))
        assert got == want, (key, got, want)


def test_scalars_keep_numbers_only_and_put_sft_records_under_sft():
    step, values = sinks.scalars({"schema": 1, "step": 3, "loss": 0.5, "n": 2, "ok": True,
                                  "codec": "delta", "frac": None, "bad": float("nan"),
                                  "ids": [1, 2]})
    assert (step, values) == (3, {"loss": 0.5, "n": 2.0})
    assert sinks.scalars({"phase": "sft", "step": 0, "sft_step": 4, "loss": 1.0}) == (
        4, {"sft/sft_step": 4.0, "sft/loss": 1.0})


# Sinks for the failure test, registered under test names (module 'test_sinks' is this file).
CALLS: list[tuple[str, int]] = []


class Recorder:
    requires, extra, options = (), "none", ()

    def open(self, run_dir, cfg, options):
        CALLS.append(("open", 0))

    def log(self, step, record):
        CALLS.append(("log", step))

    def close(self):
        CALLS.append(("close", 0))


class BoomOnLog:
    requires, extra, options = (), "none", ()

    def open(self, run_dir, cfg, options):
        pass

    def log(self, step, record):
        raise RuntimeError("disk on fire")

    def close(self):
        CALLS.append(("close after drop", 0))  # never: a dropped sink is not closed


class BoomOnOpen(BoomOnLog):
    def open(self, run_dir, cfg, options):
        raise OSError("no such server")


def test_a_sink_that_raises_is_reported_once_and_dropped(tmp_path, monkeypatch, capfd):
    monkeypatch.setitem(sinks.SINKS.entries, "recorder", "test_sinks:Recorder")
    monkeypatch.setitem(sinks.SINKS.entries, "boom_log", "test_sinks:BoomOnLog")
    monkeypatch.setitem(sinks.SINKS.entries, "boom_open", "test_sinks:BoomOnOpen")
    CALLS.clear()
    cfg = _cfg(["boom_open", "boom_log", "recorder"], steps=3)
    traingym.train(cfg, run_dir=tmp_path / "r", progress=False)
    assert [e["step"] for e in read_events(tmp_path / "r")] == [1, 2, 3]
    assert (tmp_path / "r" / "results.json").exists()
    assert CALLS == [("open", 0), ("log", 1), ("log", 2), ("log", 3), ("close", 0)]
    err = capfd.readouterr().err.splitlines()
    lines = [ln for ln in err if ln.startswith("traingym: sink")]
    assert lines == [
        "traingym: sink 'boom_open' failed in open (OSError: no such server); it is dropped "
        "and the run goes on (events.jsonl has every step)",
        "traingym: sink 'boom_log' failed in log (RuntimeError: disk on fire); it is dropped "
        "and the run goes on (events.jsonl has every step)"], err


def test_sink_names_options_and_extras_are_checked_before_any_work(tmp_path, monkeypatch):
    with pytest.raises(ConfigError, match="unknown observability.sinks 'tensorbord'.*"
                                          "did you mean 'tensorboard'"):
        _cfg(["tensorbord"])
    with pytest.raises(ConfigError, match="lists a sink twice"):
        _cfg(["mlflow", "mlflow"])
    with pytest.raises(ConfigError, match="unknown option 'projekt'.*did you mean 'project'"):
        traingym.build_config("tiny", overrides={"observability": {
            "sinks": ["wandb"], "sink_options": {"wandb": {"projekt": "x"}}}})
    with pytest.raises(ConfigError, match="sink_options.mlflow: 'mlflow' is not in"):
        traingym.build_config("tiny", overrides={"observability": {
            "sink_options": {"mlflow": {"experiment": "x"}}}})
    monkeypatch.setattr(sinks.sink_class("wandb"), "requires", ("wandb_not_installed_here",))
    with pytest.raises(ConfigError, match=r"'wandb' needs the 'wandb_not_installed_here' "
                                          r"package.*pip install 'traingym\[wandb\]'"):
        traingym.train({"steps": 2, "model": {"path": "tiny"},
                        "observability": {"sinks": ["wandb"]}}, run_dir=tmp_path / "r",
                       progress=False)
    assert not (tmp_path / "r").exists()  # refused before the run directory was made
