"""What envs keep across episodes belongs to the run (envs/resources.py): two runs in one process,
one after the other or at once in two threads, get their own sandbox pools and latency draw
counts, and closing one run closes only its own pools."""

import threading
from dataclasses import dataclass

import pytest

import traingym
from traingym.envs.code_env import GRADING_LIMITS, pool_for
from traingym.envs.latency import DelayedReward
from traingym.envs.resources import RunResources, current
from traingym.envs.tasks import digit_fraction
from traingym.envs.runner import RolloutRunner
from traingym.core.types import Completion, Observation, SamplingParams, StepResult


class IdsTokenizer:
    def decode(self, ids, skip_special_tokens=True):
        return " ".join(map(str, ids))


class OneTokenEngine:
    version = 0

    async def generate(self, requests):
        return [[Completion(r.prompt_ids, [5], [-0.1], "length", 0) for _ in range(r.n)]
                for r in requests]


class PoolEnv:
    """Takes the run's pool for the process backend (starting no sandbox) and records it; with
    a barrier, waits until the other run's env holds its pool too."""

    def __init__(self, seen: list, barrier: threading.Barrier | None = None):
        self.seen, self.barrier = seen, barrier

    async def reset(self):
        return Observation((1, 2), "p")

    async def step(self, completion):
        self.seen.append(pool_for("process", GRADING_LIMITS))
        if self.barrier is not None:
            self.barrier.wait(timeout=30)  # blocks this runner's loop thread only
        return StepResult(0.0, done=True)


def _runner(seen, barrier=None, resources=None):
    return RolloutRunner(OneTokenEngine(), lambda row: PoolEnv(seen, barrier), SamplingParams(),
                         2, tokenizer=IdsTokenizer(), resources=resources)


def test_two_runs_at_once_in_two_threads_have_their_own_pools():
    seen = {1: [], 2: []}
    barrier = threading.Barrier(2)
    runners = {k: _runner(seen[k], barrier, RunResources()) for k in seen}
    threads = [threading.Thread(target=runners[k].collect, args=([(0, {"prompt": "x"})], 1))
               for k in seen]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert len(seen[1]) == len(seen[2]) == 2  # both runs held their pools at the barrier
    pool1, pool2 = seen[1][0], seen[2][0]
    assert all(p is pool1 for p in seen[1]) and all(p is pool2 for p in seen[2])
    assert pool1 is not pool2
    runners[1].close()
    runners[1].resources.close()
    assert pool1.closed and not pool2.closed  # closing run 1 leaves run 2's pool open
    runners[2].factory = lambda row: PoolEnv(seen[2])
    runners[2].collect([(1, {"prompt": "y"})], 2)  # run 2 goes on with its pool
    assert seen[2][-1] is pool2 and not pool2.closed
    runners[2].close()
    runners[2].resources.close()
    assert pool2.closed


def test_a_run_whose_runner_never_closed_its_loop_refuses_to_close_quietly():
    resources = RunResources()
    runner = _runner([], resources=resources)
    runner.collect([(0, {"prompt": "x"})], 1)
    with pytest.raises(RuntimeError, match="still open on 1 event loop"):
        resources.close()
    with pytest.raises(RuntimeError, match="closed"):
        resources.keep("k", dict)
    runner.close()  # its loop's pool closes; nothing else left


def test_env_resources_outside_a_run_are_refused_by_name():
    with pytest.raises(RuntimeError, match="no run's resources are current"):
        current()


SEEN: dict[str, list] = {"delays": [], "pools": []}


class RecordingEnv:
    def __init__(self, inner):
        self.inner = inner

    async def reset(self):
        return await self.inner.reset()

    async def step(self, completion):
        SEEN["pools"].append(pool_for("process", GRADING_LIMITS))
        return await self.inner.step(completion)


@dataclass
class Recording(DelayedReward):
    """DelayedReward that records each draw and each episode's pool."""

    def __call__(self, example, renderer):
        env = super().__call__(example, renderer)
        SEEN["delays"].append((example["prompt"], env.delay_s))
        return RecordingEnv(env)


def test_two_training_runs_one_after_the_other_share_no_state(tmp_path):
    cfg = traingym.build_config("tiny", overrides={
        "steps": 2, "eval": {"num_prompts": 2, "samples_per_prompt": 2},
        "rollout": {"prompts_per_step": 2, "group_size": 2, "max_new_tokens": 4}})
    runs = []
    for k in range(2):
        SEEN["delays"], SEEN["pools"] = [], []
        traingym.train(cfg, env=Recording(digit_fraction, median_s=1e-4), run_dir=tmp_path / str(k),
                       progress=False)
        runs.append(dict(SEEN))
    first, second = runs
    assert first["delays"] == second["delays"]  # the draw counts restart with each run
    prompt, delay = first["delays"][0]
    assert [d for p, d in first["delays"] if p == prompt][1] != delay  # and advance within one
    # the training loop's pool, and the evaluation runners' (one per loop), all closed at the end
    assert len({id(p) for p in first["pools"]}) >= 2
    assert all(p.closed for p in first["pools"] + second["pools"])
    assert not {id(p) for p in first["pools"]} & {id(p) for p in second["pools"]}
