"""Async runs through faults that do not end them: the weight link stalls mid-run (engines
serve their last verified weights, reconnect, catch up), and the trainer is killed mid-run
(its engines exit; `--resume` continues from the last committed checkpoint). Each run ends
with every prompt of its recorded steps trained on exactly once, none lost, and the final
weights hash-verified on every engine."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import traingym
from traingym.cluster import local
from traingym.observability.events import read_events

from stall_relay import StallRelay  # tests/ is on sys.path (tests/conftest.py)


def _ledger(events, k, steps):
    assert [e["step"] for e in events] == list(range(1, steps + 1))
    trained = [i for e in events for i in e["prompt_indices"]]
    for e in events:
        assert e["async_staleness_max"] <= k
        assert len(e["prompt_indices"]) == 4
    assert len(trained) == len(set(trained)), "a prompt was trained on twice"
    taken = trained + events[-1]["async_unfinished"]
    assert sorted(taken) == list(range(len(taken))), "a prompt was lost"
    final = events[-1]["async_final_weights"]
    assert final and all(f["version"] == steps for f in final)
    return final


def _wait_for_steps(run_dir: Path, n: int, timeout: float, proc=None) -> None:
    deadline = time.monotonic() + timeout
    path = run_dir / "events.jsonl"
    while not (path.exists() and len(path.read_text().splitlines()) >= n):
        assert time.monotonic() < deadline, f"fewer than {n} steps within {timeout}s"
        assert proc is None or proc.poll() is None, f"the run ended early: {proc.returncode}"
        time.sleep(0.02)


def test_stalled_weight_link_recovers(tmp_path, monkeypatch):
    relays, real = [], local._transport

    def through_a_relay(weights_cfg, run_dir, host="127.0.0.1"):
        tc, sender = real(weights_cfg, run_dir, host)
        relays.append(StallRelay(tc.port))
        return dataclasses.replace(tc, port=relays[-1].port), sender

    monkeypatch.setattr(local, "_transport", through_a_relay)
    run_dir = tmp_path / "run"
    cfg = traingym.build_config("tiny", overrides={
        "steps": 10, "mode": "async", "threads": 1, "eval": {"before": False, "after": False},
        "weights": {"transport": "tcp", "timeout_s": 2.0, "dead_after_s": 1.0},
        "async": {"max_staleness": 1, "engine_timeout_s": 60.0}})

    def stall_once():
        _wait_for_steps(run_dir, 3, 120.0)
        relays[0].stall()
        time.sleep(4.0)  # past dead_after_s and the send timeout: both ends notice
        relays[0].flow()

    staller = threading.Thread(target=stall_once, daemon=True)
    staller.start()
    t0 = time.monotonic()
    traingym.train(cfg, run_dir=run_dir, progress=False)
    staller.join(timeout=1.0)
    events = read_events(run_dir)
    final = _ledger(events, 1, 10)
    assert final[0]["reconnects"] >= 1, "the stall was never noticed: the test would be vacuous"
    assert relays[0].connections >= 2
    assert time.monotonic() - t0 < 120
    for r in relays:
        r.close()


def _children(pid: int) -> list[int]:
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append(int(stat.parent.name))
    return out


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_killed_trainer_resumes_from_its_last_checkpoint(tmp_path):
    run_dir = tmp_path / "run"
    args = [sys.executable, "-m", "traingym.cli", "train", "--preset", "tiny", "--quiet",
            "--run-dir", str(run_dir), "--set", "steps=9", "--set", "mode=async",
            "--set", "threads=1", "--set", "weights.transport=tcp",
            "--set", "checkpoint.every=3", "--set", "eval.before=false",
            "--set", "eval.after=false", "--set", "async.engine_timeout_s=60"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    trainer = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    _wait_for_steps(run_dir, 1, 180.0, trainer)  # the engines are up before step 1
    engines = _children(trainer.pid)
    assert engines, "no engine process found"
    # checkpoint 3 is committed before step 3's record; killed two steps before checkpoint 6
    _wait_for_steps(run_dir, 4, 180.0, trainer)
    trainer.send_signal(signal.SIGKILL)
    trainer.wait(timeout=10)
    killed_at = len(read_events(run_dir))
    deadline = time.monotonic() + 15.0
    while any(_alive(p) for p in engines):  # engines notice the trainer is gone
        assert time.monotonic() < deadline, "engine processes outlived the trainer"
        time.sleep(0.1)
    saved = sorted(p.name for p in (run_dir / "checkpoints").glob("step_*"))
    last = int(saved[-1].split("_")[1])
    state = json.loads((run_dir / "checkpoints" / saved[-1] / "state.json").read_text())
    assert state["async_feed"]["redo"], "nothing was out at the checkpoint: vacuous"

    resumed = subprocess.run(args + ["--resume"], env=env, capture_output=True, text=True,
                             timeout=300)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    events = read_events(run_dir)
    assert killed_at > last, "no step was lost with the kill: the test would be vacuous"
    _ledger(events, 1, 9)
    redone = {i for i, _ in state["async_feed"]["redo"]}
    after = {i for e in events[last:] for i in e["prompt_indices"]}
    assert redone & after, "the prompts out at the checkpoint were not redone"
