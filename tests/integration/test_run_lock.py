"""One writer per run directory, and SIGTERM as a clean preemption, through the CLI in
subprocesses: a second run on a live run's directory is refused naming the holder; a SIGKILLed
run's lock does not block --resume; SIGTERM mid-run stops at a step boundary with a committed
checkpoint and the resume line, and the resumed run ends bitwise equal to a straight one."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch
from safetensors.torch import load_file

import traingym
from traingym import cli
from traingym.runs import checkpoint
from traingym.observability.events import read_events
from traingym.runs.preempt import EXIT_CODE

QUIET = ["--set", "threads=1", "--set", "eval.before=false", "--set", "eval.after=false"]
ENV = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}


def _args(run_dir: Path, steps: int, *extra: str) -> list[str]:
    return ["train", "--preset", "tiny", "--quiet", "--run-dir", str(run_dir),
            "--set", f"steps={steps}", *QUIET, *extra]


def _cli(run_dir: Path, steps: int, *extra: str) -> list[str]:
    return [sys.executable, "-m", "traingym.cli", *_args(run_dir, steps, *extra)]


def _wait_for_step(run_dir: Path, step: int, proc: subprocess.Popen, timeout: float = 120.0):
    deadline = time.monotonic() + timeout
    while True:
        path = run_dir / "events.jsonl"
        if path.exists() and any(json.loads(ln)["step"] >= step
                                 for ln in path.read_text().splitlines() if ln.strip()):
            return
        assert proc.poll() is None, f"the run ended before step {step}: {proc.communicate()}"
        assert time.monotonic() < deadline, f"no step {step} within {timeout} s"
        time.sleep(0.05)


def test_a_live_run_dir_is_refused_and_a_killed_ones_lock_is_not(tmp_path, capsys):
    run_dir = tmp_path / "run"
    first = subprocess.Popen(_cli(run_dir, 100000), env=ENV, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True)
    try:
        _wait_for_step(run_dir, 1, first)
        for flag in ((), ("--resume",)):  # a new run, then a resume (the CLI in this process)
            assert cli.main(_args(run_dir, 100000, *flag)) == 2
            err = capsys.readouterr().err
            assert err.startswith(f"traingym: run directory {run_dir} is in use by pid "
                                  f"{first.pid} on host "), err
            assert err.count("\n") == 1, err
        assert first.poll() is None, "the first run ended: the refusals would be vacuous"
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=30)
    finally:
        first.kill()
        first.wait()
    left = json.loads((run_dir / "run.lock").read_text())
    assert left["pid"] == first.pid, "the killed run's record is gone: the test would be vacuous"
    # no checkpoint yet (checkpoint.every=0): the resume starts over, and only `steps` changed
    assert cli.main(_args(run_dir, 2, "--resume")) == 0, capsys.readouterr().err
    assert [e["step"] for e in read_events(run_dir)] == [1, 2]
    assert (run_dir / "run.lock").read_text() == ""  # released at the end


def test_sigterm_stops_at_a_step_with_a_checkpoint_and_resumes_bitwise(tmp_path):
    steps = 14
    straight = tmp_path / "straight"
    cfg = traingym.build_config("tiny", overrides={
        "steps": steps, "threads": 1, "eval": {"before": False, "after": False}})
    traingym.train(cfg, run_dir=straight, progress=False)

    run_dir = tmp_path / "run"
    proc, out, err, _ = _sigterm_after_step_2(_cli(run_dir, steps), run_dir, signals=2)
    assert proc.returncode == EXIT_CODE, out + err
    stopped = read_events(run_dir)[-1]["step"]
    assert 2 <= stopped < steps, f"stopped after step {stopped}: not mid-run, the test is vacuous"
    assert err.strip().splitlines()[-1] == (
        f"traingym: stopped by SIGTERM after step {stopped}; resume with: traingym train "
        f"--preset tiny --set steps={steps} --set threads=1 --set eval.before=false --set "
        f"eval.after=false --run-dir {run_dir} --resume --quiet"), err
    saved = checkpoint.committed(run_dir / "checkpoints")
    assert [p.name for p in saved] == [f"step_{stopped:06d}"]  # checkpoint.every=0: none before
    checkpoint.verify(saved[-1])
    assert (run_dir / "run.lock").read_text() == "", "the lock was not released"
    assert not (run_dir / "results.json").exists(), "a stopped run wrote the results of an end"

    traingym.train(cfg, run_dir=run_dir, resume=True, progress=False)
    a, b = straight / f"checkpoints/step_{steps:06d}", run_dir / f"checkpoints/step_{steps:06d}"
    for name in ("model.safetensors", "optimizer.safetensors"):
        ta, tb = load_file(a / name), load_file(b / name)
        assert ta.keys() == tb.keys()
        for key in ta:
            assert torch.equal(ta[key], tb[key]), f"{name}:{key} differs after the resume"
    assert [e["step"] for e in read_events(run_dir)] == list(range(1, steps + 1))


def _children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(p) for p in path.read_text().split()] if path.exists() else []


def _sigterm_after_step_2(cmd: list[str], run_dir: Path, signals: int = 1):
    """Start `cmd`, send SIGTERM `signals` times once step 2's record is written; return the
    finished process, its stdout and stderr, and its child pids seen just before the signal."""
    proc = subprocess.Popen(cmd, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        _wait_for_step(run_dir, 2, proc)
        children = _children(proc.pid)
        for _ in range(signals):  # a second one changes nothing
            proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
        proc.wait()
    return proc, out, err, children


def test_sigterm_stops_an_async_run_with_its_ledger_and_engines_closed(tmp_path):
    """Async mode stops the same way; its checkpoint holds the ledger (async_feed) that a
    --resume redoes first (tests/cluster/test_async_faults.py covers that resume path)."""
    run_dir = tmp_path / "run"
    proc, out, err, engines = _sigterm_after_step_2(
        _cli(run_dir, 40, "--set", "mode=async", "--set", "weights.transport=tcp"), run_dir)
    assert engines, "no engine process found"
    assert proc.returncode == EXIT_CODE, out + err
    stopped = read_events(run_dir)[-1]["step"]
    assert stopped < 40 and f"stopped by SIGTERM after step {stopped}; resume with:" in err
    saved = checkpoint.committed(run_dir / "checkpoints")
    assert [p.name for p in saved] == [f"step_{stopped:06d}"]
    state = json.loads((saved[-1] / "state.json").read_text())
    assert state["async_feed"]["redo"], "no prompt was out at the engines: vacuous"
    assert (run_dir / "run.lock").read_text() == ""
    deadline = time.monotonic() + 15.0
    while any(Path(f"/proc/{p}").exists() for p in engines):
        assert time.monotonic() < deadline, "engine processes outlived the stopped run"
        time.sleep(0.1)
