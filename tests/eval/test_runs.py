"""Runs as objects (runs.py): open_run and `traingym runs` on a finished run, a running one (its
lock held in this process and by another process), a run preempted by SIGTERM and a run whose
reward function raised (both real runs of the tiny preset, stopped after step 2)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

import traingym
from traingym.runs import lock as runlock
from traingym.cli import main
from traingym.envs.tasks import digit_fraction


def test_finished_run(tiny_run):
    run = traingym.open_run(tiny_run)
    assert run.status == "finished"
    assert (run.steps_done, run.steps_total) == (4, 4)
    assert [c.step for c in run.checkpoints] == [2, 4]
    assert run.latest_checkpoint.state["step"] == 4
    assert run.latest_checkpoint.verify()  # the manifest checks out
    assert run.config.model.path == "tiny" and run.config.steps == 4
    assert [e["step"] for e in run.events] == [1, 2, 3, 4]
    results = json.loads((tiny_run / "results.json").read_text())
    assert run.results == results
    change = run.held_out_change()
    assert change == {"metric": "sampled", **results["eval"]["delta"]["sampled"]}
    assert run.eval_before["sampled"]["n_prompts"] == 16


def test_running_while_the_lock_is_held(copy_run):
    path = copy_run()
    lock = runlock.acquire(path)
    try:
        assert traingym.open_run(path).status == "running"
    finally:
        lock.release()
    assert traingym.open_run(path).status == "finished"
    # another process holds it; killed, it leaves its record behind, and is not running
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from pathlib import Path; "
         "from traingym.runs import lock as runlock; runlock.acquire(Path(sys.argv[1])); print('held', "
         "flush=True); time.sleep(120)", str(path)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        assert traingym.open_run(path).status == "running"
    finally:
        holder.kill()
        holder.wait()
    assert (path / runlock.LOCK_NAME).read_text().strip()  # the dead holder's record
    assert traingym.open_run(path).status == "finished"


def _stopping_reward(at_call: int, action):
    calls = {"n": 0}

    def reward(sample) -> float:
        calls["n"] += 1
        if calls["n"] == at_call:
            action()
        return digit_fraction(sample)

    return reward


def _tiny(**eval_cfg):
    return traingym.build_config("tiny", overrides={"eval": {"before": False, **eval_cfg}})


def test_preempted_and_failed_runs(tmp_path, capsys):
    from traingym.envs.tasks import builtin_task

    rows = builtin_task("arith", num_heldout=16)
    # tiny: 4 prompts x 4 samples = 16 reward calls a step; call 17 is in step 2
    stop = _stopping_reward(17, lambda: os.kill(os.getpid(), signal.SIGTERM))
    from traingym.runs.preempt import RunPreempted

    with pytest.raises(RunPreempted):
        traingym.train(_tiny(), dataset=rows.train, eval_dataset=rows.heldout, reward=stop,
                       run_dir=tmp_path / "runs" / "pre", progress=False)

    def boom():
        raise RuntimeError("reward broke")

    with pytest.raises(Exception, match="reward broke"):
        traingym.train(_tiny(), dataset=rows.train, eval_dataset=rows.heldout,
                       reward=_stopping_reward(33, boom), run_dir=tmp_path / "runs" / "bad",
                       progress=False)
    pre = traingym.open_run(tmp_path / "runs" / "pre")
    assert pre.status == "preempted"
    assert (pre.steps_done, pre.steps_total) == (2, 4)
    assert [c.step for c in pre.checkpoints] == [2] and pre.results is None
    bad = traingym.open_run(tmp_path / "runs" / "bad")
    assert bad.status == "failed"
    assert (bad.steps_done, bad.checkpoints) == (2, [])

    capsys.readouterr()
    assert main(["runs", str(tmp_path / "runs")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["run", "status", "steps", "last", "reward", "held-out", "change"]
    table = {ln.split()[0].rsplit("/", 1)[-1]: ln.split() for ln in lines[1:]}
    assert table["pre"][1:3] == ["preempted", "2/4"]
    assert table["bad"][1:3] == ["failed", "2/4"]
    assert table["pre"][3] == f"{pre.events[-1]['reward_mean']:.3f}" and table["pre"][4] == "-"


def test_runs_table_and_errors(tiny_run, tmp_path, capsys):
    assert main(["runs", str(tiny_run.parent)]) == 0
    out = capsys.readouterr().out
    d = json.loads((tiny_run / "results.json").read_text())["eval"]["delta"]["sampled"]
    assert f"finished  4/4" in out and f"sampled {d['delta']:+.3f} ± {d['se']:.3f}" in out
    assert main(["runs", str(tmp_path / "nothing")]) == 2
    assert capsys.readouterr().err.startswith("traingym: ")
    (tmp_path / "empty").mkdir()
    assert main(["runs", str(tmp_path / "empty")]) == 0
    assert "no runs under" in capsys.readouterr().out
    with pytest.raises(FileNotFoundError, match="not a run directory"):
        traingym.open_run(tmp_path / "empty")


def test_a_run_written_before_keys_moved_still_reads(copy_run):
    # config.MOVED_KEYS: e.g. trainer.clip_low moved to algorithm.clip_low
    from traingym.config.load import MOVED_KEYS

    path = copy_run()
    data = json.loads((path / "config.json").read_text())
    new = MOVED_KEYS["trainer.clip_low"]
    data.pop(new.split(".")[0], None)
    data["trainer"]["clip_low"] = 0.31
    (path / "config.json").write_text(json.dumps(data))
    assert traingym.open_run(path).config.algorithm.clip_low == 0.31
