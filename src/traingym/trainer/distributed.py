"""Data-parallel trainer over processes (`trainer.data_parallel = W > 1`), DDP or FSDP2 on gloo.

Rank 0 is the driver process; ranks 1..W-1 are local processes (trainer/local_ranks.py) or Ray
actors (trainer/ray_ranks.py). It has TorchTrainer's interface. Each rank takes a contiguous run
of whole groups and the same clipped AdamW step (collectives kept identical: trainer/rank.py),
so the parameters equal a single process's up to float rounding; per-token stats are summed
over ranks. `.model` / `.optimizer` are rank 0's, gathered in full under FSDP2 so that
runs/checkpoint.py writes the same files for every W; what is loaded into them is pushed to every
rank before the next step (seen through tensor identities and version counters). A rank that
fails or hangs (`trainer.dist_timeout_s`) raises TrainerRankError and closes the trainer.
Not covered: GPUs/NCCL, tensor or pipeline parallelism, restarting a dead rank, uneven token
loads (split by groups, not tokens), a driver that already holds a default process group.
"""

from __future__ import annotations

import datetime
import os
import weakref

import torch
import torch.distributed as dist

from traingym.algorithms.grpo import GRPO
from traingym.algorithms.importance import ImportanceSpec
from traingym.core import trace
from traingym.core.types import Batch
from traingym.trainer.config import TrainerConfig
from traingym.trainer.local_ranks import LocalPlacement
from traingym.trainer.rank import (
    Rank,
    RankSpec,
    build_replica,
    fqn_optimizer_state,
    indexed_optimizer_state,
    manifest,
    tied_names,
    trainable_names,
)
from traingym.trainer.optimizers import make_optimizer
from traingym.trainer.replay import route_fractions
from traingym.trainer.torch_trainer import batch_tokens, check_finite, empty_metrics

GRACE_S = 5.0  # after rank 0 fails, how long a worker's own error report may take to arrive
START_S = 120.0  # a worker's start (spawn, import torch and transformers, build the model)


class TrainerRankError(RuntimeError):
    """A worker rank of the data-parallel trainer failed; the message names rank and cause."""


def split_groups(batch: Batch, world: int) -> list[tuple[list, list]]:
    """W contiguous runs of whole groups (sizes differ by at most one; some may be empty)."""
    n = len(batch.groups)
    cuts = [n * r // world for r in range(world + 1)]
    return [(batch.groups[a:b], batch.advantages_G[a:b]) for a, b in zip(cuts, cuts[1:])]


def fingerprint(model, optimizer) -> tuple:
    """Identity, storage and version counter of every parameter, buffer and optimizer state
    tensor, and the optimizer's hyperparameters: changes when either is loaded or edited."""
    tensors = [*model.parameters(), *model.buffers()]
    states = [v for st in optimizer.state.values() for v in st.values() if torch.is_tensor(v)]
    hyper = [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups]
    return ([(id(t), t.data_ptr(), t._version) for t in tensors + states], repr(hyper))


def _is_comm_error(err: BaseException) -> bool:
    """A failed or timed-out gloo collective (gloo raises RuntimeError naming itself)."""
    return isinstance(err, dist.DistError) or (type(err) is RuntimeError and "gloo" in str(err))


class DistributedTrainer:
    def __init__(self, model, trainer: TrainerConfig, cluster,
                 temperature: float, pad_token_id: int, importance: ImportanceSpec | None = None,
                 algorithm=None, threads: int = 0):
        """The sections it reads: `trainer`, `cluster` (the cluster section: where the ranks
        run; only its `type` and, on Ray, the Ray settings are read), the rollout
        `temperature`, `threads` (0: cores / W locally, 1 on Ray); `importance` (None: no
        correction) and `algorithm` (None: GRPO with its defaults) as TorchTrainer takes
        them; each rank gets them through its RankSpec."""
        t = trainer
        if algorithm is None:
            algorithm = GRPO()
        if dist.is_initialized():
            raise RuntimeError("trainer.data_parallel > 1: this process already holds a "
                               "torch.distributed default group; the trainer needs its own")
        if getattr(model, "config", None) is None:
            raise TypeError("trainer.data_parallel > 1 rebuilds the model in each worker from "
                            "type(model)(model.config): it needs a Hugging Face model")
        self.cfg, self.world, self.parallelism = t, t.data_parallel, t.parallelism
        self.closed, self._handed = False, None
        self.ties = tied_names(model)  # FSDP2's gathered state unties them; export re-ties
        if cluster.type == "ray":
            from traingym.trainer.ray_ranks import RayPlacement  # heavy: ray

            self.placement = RayPlacement(cluster, t.dist_timeout_s)
            threads = threads or 1
        else:
            self.placement = LocalPlacement()
            threads = threads or max(1, (os.cpu_count() or 1) // self.world)
        self.handles = []
        try:
            store = dist.TCPStore(self.placement.host, 0, self.world, is_master=True,
                                  timeout=datetime.timedelta(seconds=t.dist_timeout_s),
                                  wait_for_workers=False)
            self.spec = RankSpec(
                self.world, self.placement.host, store.port, t.parallelism, t.dist_timeout_s,
                t, temperature, pad_token_id,
                importance, type(model), model.config,
                manifest(model), [n for n, p in model.named_parameters() if not p.requires_grad],
                threads, algorithm, trace.enabled(), trace.shard_dir(),
                self.placement.driver_node)
            self.handles = self.placement.start(self.spec)
            self._finalizer = weakref.finalize(self, _kill, list(self.handles),
                                               self.placement)
            self.rank = Rank(self.spec, 0, model)
            for h in self.handles:
                kind, info = h.reply(max(START_S, t.dist_timeout_s))
                if kind != "ok":
                    raise TrainerRankError(f"trainer rank {h.rank} failed to start: {info}")
                h.pid, h.node = info["pid"], info["node"]
            self._everyone("join", lambda: self.rank.join(store))
        except BaseException:
            self._abort()
            raise

    # -- the Trainer protocol ------------------------------------------------------------------
    def train_step(self, batch: Batch) -> dict[str, float]:
        self._check_open()
        total = batch_tokens(batch)
        if total == 0:
            return empty_metrics(self.cfg.lr)
        self._sync_pending()
        parts = split_groups(batch, self.world)
        denom = self.rank.spec.algorithm.denominator(batch)  # the algorithm's loss divisor
        mine, theirs = self._everyone("step", lambda: self.rank.step(*parts[0], total, denom),
                                      [(g, a, total, denom) for g, a in parts[1:]])
        stats: dict[str, float] = {}
        for rank, part in enumerate((mine, *theirs)):
            trace.write_shipped(part.pop("_trace", []), f"rank-{rank}",
                                self.handles[rank - 1].pid if rank else 0)  # Ray, another node
            for k, v in part.items():
                if k != "grad_norm":
                    stats[k] = stats.get(k, 0.0) + v
        grad_norm = check_finite(mine["grad_norm"])  # every rank skipped the step alike
        return route_fractions({**stats, "grad_norm": grad_norm, "trained_tokens": total,
                                "lr": self.cfg.lr})  # MoE route counts: trainer/replay.py

    def export(self) -> dict[str, torch.Tensor]:
        self._check_open()
        self._sync_pending()
        if self.parallelism == "ddp":
            return self.rank.export()  # rank 0's replica; no collective
        state = self._everyone("export", self.rank.export)[0]
        for name, first in self.ties.items():  # one tensor, as the engines' models hold it
            state[name] = state[first]
        return state

    @property
    def model(self):
        return self._handout()[0]

    @property
    def optimizer(self):
        return self._handout()[1]

    def close(self) -> None:
        """Workers leave the group and exit; rank 0's group is destroyed. Idempotent."""
        if self.closed:
            return
        try:
            self._everyone("close", self.rank.leave)
        except BaseException:
            self._abort()
            raise
        for h in self.handles:
            h.wait_exit(10.0)
        self._finalizer.detach()
        self.placement.release()
        self.closed = True

    @property
    def ranks(self) -> list[dict]:
        """Where each rank runs: rank, pid, node (Ray node id; None locally)."""
        return [{"rank": 0, "pid": os.getpid(), "node": self.placement.driver_node},
                *({"rank": h.rank, "pid": h.pid, "node": h.node} for h in self.handles)]

    # -- helpers -------------------------------------------------------------------------------
    def _everyone(self, cmd: str, own, args: list | None = None):
        """Send `cmd` to every worker, run rank 0's part, collect the answers."""
        args = args if args is not None else [None] * len(self.handles)
        for h, a in zip(self.handles, args):
            h.send(cmd, a)
        try:
            mine = own()
        except BaseException as err:
            self._fail(cmd, err)
        replies = [h.reply(self.cfg.dist_timeout_s) for h in self.handles]
        bad = [(h, r) for h, r in zip(self.handles, replies) if r[0] != "ok"]
        if bad:
            self._abort()
            raise TrainerRankError(self._describe(cmd, bad))
        return mine, [value for _, value in replies]

    def _fail(self, cmd: str, err: BaseException):
        """Rank 0's part raised: name a worker that failed or went silent, if one did."""
        if not isinstance(err, Exception):  # KeyboardInterrupt: no grace period
            self._abort()
            raise err
        replies = [(h, h.reply(GRACE_S)) for h in self.handles]
        failed = [(h, r) for h, r in replies if r[0] in ("error", "dead")]
        silent = [(h, r) for h, r in replies if r[0] == "silent"]
        self._abort()
        if failed:
            raise TrainerRankError(self._describe(cmd, failed)) from err
        if silent and _is_comm_error(err):
            raise TrainerRankError(self._describe(cmd, silent) + "; rank 0's collective "
                                   f"failed: {str(err).splitlines()[0]}") from err
        raise err

    def _describe(self, cmd: str, bad) -> str:
        return "; ".join(f"trainer rank {h.rank} (pid {h.pid}) {_what(kind)} during {cmd}: "
                         f"{text}" for h, (kind, text) in bad)

    def _check_open(self) -> None:
        if self.closed:
            raise RuntimeError("the data-parallel trainer is closed (after close() or an "
                               "earlier failure); resume the run from its last checkpoint")

    def _handout(self):
        self._check_open()
        if self._handed is None:
            if self.parallelism == "ddp":
                model, opt = self.rank.model, self.rank.trainer.optimizer
            else:
                model, opt = self._gather_copy()
            self._handed = (model, opt, fingerprint(model, opt))
        return self._handed[:2]

    def _gather_copy(self):
        """FSDP2: the full model and optimizer state on rank 0, as a plain model + AdamW."""
        full_model, full_optim = self._everyone("gather", self.rank.gather)[0]
        copy = build_replica(self.spec)
        copy.load_state_dict(full_model)
        opt = make_optimizer(copy, self.cfg)
        opt.load_state_dict(indexed_optimizer_state(full_optim, trainable_names(copy)))
        return copy, opt

    def _sync_pending(self) -> None:
        """Push what was loaded into the handed-out model/optimizer to every rank."""
        if self._handed is None:
            return
        model, opt, before = self._handed
        self._handed = None
        if fingerprint(model, opt) == before:
            return
        model_state = model.state_dict()
        optim_state = fqn_optimizer_state(opt.state_dict(), trainable_names(model))
        self._everyone("push", lambda: self.rank.push(model_state, optim_state))

    def _abort(self) -> None:
        """After a failure: kill the workers, leave the group, release the placement."""
        self.closed = True
        _kill(self.handles, self.placement)
        if hasattr(self, "_finalizer"):
            self._finalizer.detach()
        if hasattr(self, "rank"):
            self.rank.abort()


def _what(kind: str) -> str:
    return {"error": "failed", "dead": "is gone", "silent": "did not answer"}.get(kind, kind)


def _kill(handles, placement) -> None:
    for h in handles:
        try:
            h.kill()
        except Exception:  # a handle already gone; the others must still be killed
            pass
    placement.release()
