"""The data-parallel trainer (trainer/distributed.py) against the single-process TorchTrainer,
on the tiny model in fp32 over local worker processes and gloo.

- DDP and FSDP2 with W = 2 give the parameters, loss and grad norm of one process on the
  whole batch, over two steps whose groups split unevenly (3 + 2, so rank 0 runs two
  micro-batches and rank 1 one) and include a micro-batch whose completions are all one
  token long (one model call instead of two); `export()` equals the reference's weights,
  tied weights (embedding and head) still one tensor.
- `.model` / `.optimizer` round-trip through checkpoint.py: a checkpoint saved at step 2 and
  loaded back after step 3 is pushed to every rank (step 3 redone equals the reference's).
- A full sync `traingym.train` with trainer.data_parallel = 2 runs, matches a one-process run
  at step 1 (same rollouts), and resumes from its checkpoint.
- A sync `traingym.train` with FSDP2 ranks commits its checkpoints, and a resume from the
  step-1 checkpoint redoes step 2 bit for bit.
- A worker killed (SIGKILL), stopped (SIGSTOP: hung) or raising (an out-of-vocabulary token
  only in its groups) makes train_step raise TrainerRankError naming rank 1 and the cause
  within seconds (the stopped one after the 3 s gloo timeout), and the trainer is closed.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import signal
import time

import pytest
import torch
from dp_batches import RTOL, WEIGHTS_RTOL, close, rel  # tests/ is on sys.path (tests/conftest.py)
from dp_batches import batch as make_batch
from safetensors.torch import load_file

import traingym
from traingym.runs import checkpoint
from traingym.core.errors import ConfigError
from traingym.models.loader import load_policy
from traingym.observability.events import read_events
from traingym.loop.trainer import build_trainer
from traingym.trainer.distributed import DistributedTrainer, TrainerRankError
from traingym.trainer.torch_trainer import TorchTrainer
from traingym.weights.colocated import wire_state


def _cfg(**trainer):
    return traingym.build_config("tiny", overrides={"threads": 1, "trainer": {
        "micro_batch_groups": 2, "lr": 1e-2, **trainer}})


@pytest.fixture(scope="module")
def tiny():
    model, tok = load_policy("tiny", seed=3)
    return model, tok.pad_token_id


@pytest.mark.parametrize("parallelism", ["ddp", "fsdp2"])
def test_two_ranks_equal_one_process_and_checkpoints_round_trip(tiny, parallelism, tmp_path):
    model, pad = tiny
    cfg = _cfg(data_parallel=2, parallelism=parallelism)
    ref = TorchTrainer(copy.deepcopy(model), cfg.trainer, 1.0, pad)
    t0 = time.monotonic()
    dp = build_trainer(cfg, copy.deepcopy(model), pad)
    print(f"{parallelism}: started in {time.monotonic() - t0:.1f}s")
    try:
        assert isinstance(dp, DistributedTrainer) and len(dp.ranks) == 2
        for step in range(2):
            got, want = dp.train_step(make_batch(step)), ref.train_step(make_batch(step))
            for k in ("loss", "entropy", "grad_norm", "trained_tokens"):
                assert close(got[k], want[k]), (step, k, got[k], want[k])
        assert rel(dp.export(), ref.export()) < WEIGHTS_RTOL
        # tied weights stay one tensor (FSDP2 gathers them apart): the engines' hash sees
        # the same names as a single process publishes
        assert wire_state(dp.export(), torch.float32).keys() == \
            wire_state(ref.export(), torch.float32).keys()
        assert rel(dp.model.state_dict(), ref.model.state_dict()) < WEIGHTS_RTOL
        saved = checkpoint.save(tmp_path / "ck", 2, dp.model, dp.optimizer, {}, keep=1)
        ref_at_2 = copy.deepcopy(ref)

        dp.train_step(make_batch(7))  # moves every rank away from the checkpoint
        checkpoint.load(saved, dp.model, dp.optimizer)  # rank 0 only; pushed on the next use
        got, want = dp.train_step(make_batch(7)), ref_at_2.train_step(make_batch(7))
        assert close(got["loss"], want["loss"]) and close(got["grad_norm"], want["grad_norm"])
        assert rel(dp.export(), ref_at_2.export()) < WEIGHTS_RTOL
        assert rel(dp.export(), ref.export()) > 100 * RTOL  # the load was not a no-op
    finally:
        dp.close()
    assert dp.closed and all(not _alive(r["pid"]) for r in dp.ranks[1:])


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie is not alive
        return f.read().split()[2] != "Z"


@pytest.mark.parametrize("how", ["kill", "stop", "raise"])
def test_a_failed_worker_fails_the_step_fast_naming_it(tiny, how):
    model, pad = tiny
    dp = build_trainer(_cfg(data_parallel=2, dist_timeout_s=3.0), copy.deepcopy(model), pad)
    worker = dp.ranks[1]["pid"]
    batch = make_batch(0)
    expect = {"kill": r"trainer rank 1 \(pid \d+\) is gone during step: died \(killed by "
                      r"SIGKILL\)",
              "stop": r"trainer rank 1 \(pid \d+\) did not answer during step",
              "raise": r"trainer rank 1 \(pid \d+\) failed during step: IndexError"}[how]
    if how == "kill":
        os.kill(worker, signal.SIGKILL)
    elif how == "stop":
        os.kill(worker, signal.SIGSTOP)
    else:  # a token id past the vocabulary, only in rank 1's groups
        batch.groups[4].samples[0].completion_ids[0] = 10**6
    try:
        t0 = time.monotonic()
        with pytest.raises(TrainerRankError, match=expect):
            dp.train_step(batch)
        elapsed = time.monotonic() - t0
        print(f"{how}: raised after {elapsed:.1f}s")
        assert elapsed < 15.0
        assert dp.closed
        with pytest.raises(RuntimeError, match="closed"):
            dp.train_step(batch)
        deadline = time.monotonic() + 10
        while _alive(worker) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(worker)
    finally:
        if _alive(worker):
            os.kill(worker, signal.SIGKILL)


def test_sync_run_with_two_ranks_matches_one_process_and_resumes(tmp_path):
    def cfg(dp, steps):
        trainer = {"data_parallel": dp} if dp > 1 else {}
        return traingym.build_config("tiny", overrides={
            "steps": steps, "threads": 1, "trainer": trainer, "checkpoint": {"every": 1},
            "eval": {"before": False, "after": False}})

    traingym.train(cfg(2, 2), run_dir=tmp_path / "dp", progress=False)
    traingym.train(cfg(1, 1), run_dir=tmp_path / "one", progress=False)
    two, one = read_events(tmp_path / "dp"), read_events(tmp_path / "one")
    assert [e["step"] for e in two] == [1, 2]
    assert two[0]["reward_mean"] == one[0]["reward_mean"]  # the same rollouts at step 1
    for k in ("loss", "grad_norm", "entropy"):
        assert close(two[0][k], one[0][k]), (k, two[0][k], one[0][k])
    ck = sorted(p.name for p in (tmp_path / "dp" / "checkpoints").glob("step_*"))
    assert ck == ["step_000001", "step_000002"]

    result = traingym.train(cfg(2, 3), run_dir=tmp_path / "dp", resume=True, progress=False)
    events = read_events(tmp_path / "dp")
    assert [e["step"] for e in events] == [1, 2, 3] and result.final_metrics["step"] == 3
    state = json.loads((tmp_path / "dp" / "checkpoints" / "step_000003" / "state.json")
                       .read_text())
    assert state["step"] == 3


def test_fsdp2_run_checkpoints_and_resumes_bitwise(tmp_path):
    """`traingym.train` with FSDP2 ranks (the test above runs DDP; FSDP2's update equals one
    process's in the first test): both steps train, the checkpoints are committed, and resumed
    from its step-1 checkpoint (a copy of the run directory without step 2) the run redoes
    step 2 bit for bit: weights, optimizer state, metrics."""
    def cfg(steps):
        return traingym.build_config("tiny", overrides={
            "steps": steps, "threads": 1, "trainer": {"data_parallel": 2, "parallelism": "fsdp2"},
            "checkpoint": {"every": 1}, "eval": {"before": False, "after": False}})

    straight, split = tmp_path / "fsdp2", tmp_path / "split"
    traingym.train(cfg(2), run_dir=straight, progress=False)
    fsdp2 = read_events(straight)
    assert [e["step"] for e in fsdp2] == [1, 2]
    assert all(e["trained_tokens"] > 0 and e["grad_norm"] > 0 for e in fsdp2)
    ck = straight / "checkpoints"
    assert sorted(p.name for p in ck.glob("step_*")) == ["step_000001", "step_000002"]
    assert all((p / "COMMITTED").is_file() for p in ck.glob("step_*"))

    shutil.copytree(straight, split)
    shutil.rmtree(split / "checkpoints" / "step_000002")
    result = traingym.train(cfg(2), run_dir=split, resume=True, progress=False)
    assert result.final_metrics["step"] == 2
    a, b = ck / "step_000002", split / "checkpoints" / "step_000002"
    for name in ("model.safetensors", "optimizer.safetensors"):
        ta, tb = load_file(a / name), load_file(b / name)
        assert ta.keys() == tb.keys()
        for key in ta:
            assert torch.equal(ta[key], tb[key]), f"{name}:{key} differs after the resume"
    assert rel(load_file(a / "model.safetensors"),
               load_file(ck / "step_000001" / "model.safetensors")) > 100 * RTOL  # step 2 moved
    redone = read_events(split)
    assert [e["step"] for e in redone] == [1, 2]
    for k in ("reward_mean", "loss", "grad_norm", "entropy", "trained_tokens"):
        assert redone[1][k] == fsdp2[1][k], (k, redone[1][k], fsdp2[1][k])


def test_config_names_the_problem():
    with pytest.raises(ConfigError, match="apply only with trainer.data_parallel > 1"):
        traingym.build_config("tiny", overrides={"trainer": {"parallelism": "fsdp2"}})
    with pytest.raises(ConfigError, match="'trainer.parallelism'"):
        traingym.build_config("tiny", overrides={"trainer": {"data_parallel": 2,
                                                             "parallelism": "zero3"}})
    with pytest.raises(ConfigError, match="trainer_resources and sandbox_\\* apply only"):
        traingym.build_config("tiny", overrides={"cluster": {"trainer_resources": {"a": 1}}})


def test_a_driver_that_holds_a_process_group_is_refused(tiny, monkeypatch):
    model, pad = tiny
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    with pytest.raises(RuntimeError, match="already holds a torch.distributed default group"):
        cfg = _cfg(data_parallel=2)
        DistributedTrainer(model, cfg.trainer, cfg.cluster, cfg.rollout.temperature, pad)

