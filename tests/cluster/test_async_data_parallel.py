"""Local async mode with a data-parallel trainer (`trainer.data_parallel = 2`): rank 0 in the
driver, rank 1 a local worker process, the engine in its own process, weights over tcp.

Every step gives each rank some of the batch's groups, and its update equals a one-process
trainer's on the whole batch (loss, grad norm, and the weights after the run, up to float
rounding): rank 0 never sees rank 1's groups, so a rank 1 that skipped them, or gradients not
reduced between the ranks, would give a different update. Every prompt is trained on once and
the engine's final weights are hash-verified against the trainer's. The same on two Ray nodes:
tests/cluster/test_ray.py. Took 38-44 s here (about 25 s of CPU) on 2 cores shared with other work.
"""

from __future__ import annotations

import copy
import os

from dp_batches import RTOL, WEIGHTS_RTOL, close, rel  # tests/ is on sys.path (tests/conftest.py)

import traingym
from traingym.algorithms.importance import ImportanceSpec
from traingym.loop.async_loop import async_train_loop
from traingym.loop.build import build_run
from traingym.loop.trainer import build_algorithm
from traingym.observability.events import read_events
from traingym.trainer import distributed
from traingym.trainer.distributed import DistributedTrainer
from traingym.trainer.torch_trainer import TorchTrainer


def test_async_run_with_two_local_ranks_trains_as_one_process(tmp_path, monkeypatch):
    steps = 3
    cfg = traingym.build_config("tiny", overrides={
        "steps": steps, "mode": "async", "threads": 1, "weights": {"transport": "tcp"},
        "trainer": {"data_parallel": 2, "lr": 1e-2},
        "async": {"engine_timeout_s": 60.0, "max_staleness": 1},
        "eval": {"before": False, "after": False}})
    splits, split_groups = [], distributed.split_groups

    def split(batch, world):  # what each rank is given
        parts = split_groups(batch, world)
        splits.append([len(groups) for groups, _ in parts])
        return parts

    monkeypatch.setattr(distributed, "split_groups", split)
    run, start = build_run(cfg, tmp_path / "run", False, progress=False)
    dp = run.trainer
    try:
        assert isinstance(dp, DistributedTrainer)
        assert [r["rank"] for r in dp.ranks] == [0, 1] and dp.ranks[1]["pid"] != os.getpid()
        # the same weights and a fresh AdamW, IS-corrected as async mode is
        ref = TorchTrainer(copy.deepcopy(dp.model), cfg.trainer, cfg.rollout.temperature,
                           run.tokenizer.pad_token_id,
                           importance=ImportanceSpec.from_section(cfg.algorithm, cfg.mode),
                           algorithm=build_algorithm(cfg))
        before = {k: v.clone() for k, v in ref.export().items()}
        pairs, train_step = [], dp.train_step

        def both(batch):
            got = train_step(batch)
            pairs.append((got, ref.train_step(batch)))
            return got

        dp.train_step = both
        metrics = async_train_loop(run, start)
        assert len(pairs) == steps, "a step trained on nothing"
        # rank 0 never saw rank 1's groups, so the equal update below needs rank 1's gradient
        assert len(splits) == steps and all(min(n) > 0 for n in splits), splits
        for step, (got, want) in enumerate(pairs, 1):
            for k in ("loss", "grad_norm", "trained_tokens"):
                assert close(got[k], want[k]), (step, k, got[k], want[k])
            assert want["grad_norm"] > 0
        assert rel(dp.export(), ref.export()) < WEIGHTS_RTOL
        assert rel(ref.export(), before) > 100 * RTOL, "the weights never moved: vacuous"
    finally:  # as api.train does
        try:
            run.close()
        finally:
            dp.close()
            run.lock.release()
    events = read_events(tmp_path / "run")
    assert [e["step"] for e in events] == list(range(1, steps + 1))
    assert all(e["trained_tokens"] > 0 and e["async_staleness_max"] <= 1 for e in events)
    trained = [i for e in events for i in e["prompt_indices"]]
    taken = trained + metrics["async_unfinished"]
    assert sorted(taken) == list(range(len(taken))), "a prompt was lost or trained twice"
    final = metrics["async_final_weights"]  # hash-verified against the publisher
    assert [f["version"] for f in final] == [steps]
