"""One rank of the data-parallel trainer (trainer/distributed.py): its process group, its
replica (DDP) or shard (FSDP2), and the optimizer step on its slice of a batch.

Every rank runs TorchTrainer's code on its own groups, the loss divided by the WHOLE batch's
policy tokens and multiplied by W, so the averaged gradient is a single process's. Micro-batches
accumulate with gradient sync off; then one sync pass (one token, loss 0 x logits) runs the
all-reduce or reduce-scatter, so every rank makes the same collectives whatever its number of
model calls (FSDP2 keeps parameters gathered until then; a rank with no groups runs only the
sync pass). Weights move only by collectives; torch's distributed.checkpoint.state_dict
gathers and pushes full state to and from rank 0.
Not covered: GPUs and NCCL (gloo, CPU tensors); FSDP2 with mixed precision, CPU offload or bf16
autocast; parameters a forward leaves unused; the KL reference is a full copy on every rank.
"""

from __future__ import annotations

import contextlib
import ctypes
import datetime
import gc
import itertools
import traceback
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from traingym.core import trace
from traingym.core.ties import alias_groups
from traingym.trainer.config import TrainerConfig
from traingym.trainer.torch_trainer import TorchTrainer


@dataclass
class RankSpec:
    """What a worker rank needs to build its replica and join the group (small, picklable)."""

    world: int
    host: str  # where rank 0's TCPStore listens
    port: int
    parallelism: str  # "ddp" | "fsdp2"
    timeout_s: float
    trainer: TrainerConfig
    temperature: float
    pad_token_id: int
    importance: Any  # ImportanceSpec (algorithms/importance.py) or None
    model_cls: type
    model_config: Any  # the HF config the model class is built from
    manifest: list[tuple[str, tuple[int, ...], str]]  # rank 0's parameters and buffers
    frozen: list[str]  # parameters that do not require grad
    threads: int
    algorithm: Any = None  # algorithms/base.py Algorithm (None: GRPO's defaults)
    trace: bool = False  # record spans (core/trace.py) ...
    trace_dir: str | None = None  # ... into this shard folder (None: shipped with step answers)
    trace_node: str | None = None  # the Ray node that folder is on (None: this machine)


def _tensors(model) -> list[tuple[str, torch.Tensor]]:
    return [*model.named_parameters(), *model.named_buffers()]


def manifest(model) -> list[tuple[str, tuple[int, ...], str]]:
    return [(n, tuple(t.shape), str(t.dtype)) for n, t in _tensors(model)]


def tied_names(model) -> dict[str, str]:
    """State-dict names that alias an earlier one (tied weights): {name: first name}."""
    groups = alias_groups(model.state_dict(keep_vars=True), sort=False)
    return {name: g[0] for g in groups for name in g[1:]}


def build_replica(spec: RankSpec):
    """A model of rank 0's architecture, dtypes and trainable set; its values are overwritten
    by rank 0's when the rank joins."""
    model = spec.model_cls(spec.model_config)
    mine = _tensors(model)
    got = [(n, tuple(t.shape)) for n, t in mine]
    want = [(n, shape) for n, shape, _ in spec.manifest]
    if got != want:
        here, there = next((g, w) for g, w in itertools.zip_longest(got, want) if g != w)
        raise ValueError(f"{spec.model_cls.__name__}(config) does not rebuild rank 0's model: "
                         f"first difference {here} here, {there} on rank 0")
    with torch.no_grad():
        for (_, t), (_, _, dtype) in zip(mine, spec.manifest):
            if str(t.dtype) != dtype:
                t.data = t.data.to(getattr(torch, dtype.removeprefix("torch.")))
    frozen = set(spec.frozen)
    for name, p in model.named_parameters():
        p.requires_grad_(name not in frozen)
    return model.train()


def _ddp(model):
    from torch.nn.parallel import DistributedDataParallel

    # rank 0's values were broadcast at join; buffers are constant (rotary tables)
    return DistributedDataParallel(model, init_sync=False, forward_sync_buffers=False)


def _fsdp2(model, world: int):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (world,))
    blocks = set(getattr(model, "_no_split_modules", None) or ())  # HF: the decoder layer
    for module in [m for m in model.modules() if type(m).__name__ in blocks]:
        fully_shard(module, mesh=mesh, reshard_after_forward=False)
    fully_shard(model, mesh=mesh, reshard_after_forward=False)
    return model


def fqn_optimizer_state(state: dict, names: list[str]) -> dict:
    """An optimizer state_dict keyed by parameter index -> keyed by parameter name (the form
    torch's distributed.checkpoint.state_dict reads and writes)."""
    return {"state": {names[i]: v for i, v in state["state"].items()},
            "param_groups": [{**g, "params": [names[i] for i in g["params"]]}
                             for g in state["param_groups"]]}


def indexed_optimizer_state(state: dict, names: list[str]) -> dict:
    index = {n: i for i, n in enumerate(names)}
    return {"state": {index[n]: v for n, v in state["state"].items()},
            "param_groups": [{**g, "params": [index[n] for n in g["params"]]}
                             for g in state["param_groups"]]}


def trainable_names(model) -> list[str]:
    """Names in optimizer index order (trainer/optimizers.py: make_optimizer)."""
    return [n for n, p in model.named_parameters() if p.requires_grad]


class Rank:
    def __init__(self, spec: RankSpec, rank: int, model):
        self.spec, self.rank, self.model = spec, rank, model
        self.trainer: TorchTrainer | None = None

    def join(self, store=None) -> None:
        """Join the group (rank 0 passes its TCPStore), take rank 0's weights, wrap."""
        s = self.spec
        timeout = datetime.timedelta(seconds=s.timeout_s)
        if store is None:
            store = dist.TCPStore(s.host, s.port, s.world, is_master=False, timeout=timeout)
        dist.init_process_group("gloo", store=store, rank=self.rank, world_size=s.world,
                                timeout=timeout)
        with torch.no_grad():
            for _, t in _tensors(self.model):
                dist.broadcast(t.detach(), src=0)
        wrap = _ddp if s.parallelism == "ddp" else (lambda m: _fsdp2(m, s.world))
        self.trainer = TorchTrainer(self.model, s.trainer, s.temperature, s.pad_token_id,
                                    importance=s.importance, wrap=wrap,
                                    algorithm=s.algorithm)

    def step(self, groups, advantages_G, total_tokens: int,
             denom: float | None = None) -> dict[str, float]:
        """Forward/backward on this rank's groups, one gradient sync, clip, AdamW (skipped on
        every rank alike when the global grad norm is not finite)."""
        t = self.trainer
        t.optimizer.zero_grad(set_to_none=True)
        with self._no_sync():
            stats = t.accumulate(groups, advantages_G, total_tokens, scale=self.spec.world,
                                 denom=denom)
        ids = torch.tensor([[self.spec.pad_token_id]])
        with trace.span("gradient_sync", cat="trainer"):
            logits = t.forward_model(input_ids=ids, use_cache=False).logits
            (logits.float().sum() * 0.0).backward()  # the sync pass: same collectives on all
        return {**stats, "grad_norm": t.clip_and_step()}

    @contextlib.contextmanager
    def _no_sync(self):
        fm = self.trainer.forward_model
        if self.spec.parallelism == "ddp":
            with fm.no_sync():
                yield
            return
        fm.set_requires_gradient_sync(False)
        fm.set_reshard_after_backward(False)
        try:
            yield
        finally:
            fm.set_requires_gradient_sync(True)
            fm.set_reshard_after_backward(True)

    def export(self) -> dict[str, torch.Tensor] | None:
        """Full weights on rank 0, None elsewhere (a collective under FSDP2; under DDP only
        rank 0 is asked)."""
        if self.spec.parallelism == "ddp":
            return self.trainer.export()
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        full = StateDictOptions(full_state_dict=True, cpu_offload=True)
        state = get_model_state_dict(self.trainer.forward_model, options=full)
        return state if self.rank == 0 else None

    def gather(self) -> tuple[dict, dict] | None:
        """(full model state, full optimizer state keyed by name) on rank 0 (a collective)."""
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_model_state_dict,
            get_optimizer_state_dict,
        )

        full = StateDictOptions(full_state_dict=True, cpu_offload=True)
        fm = self.trainer.forward_model
        model = get_model_state_dict(fm, options=full)
        optim = get_optimizer_state_dict(fm, self.trainer.optimizer, options=full)
        return (model, optim) if self.rank == 0 else None

    def push(self, model_state: dict | None = None, optim_state: dict | None = None) -> None:
        """Every rank takes rank 0's full model and optimizer state (a collective; workers
        pass nothing)."""
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            set_model_state_dict,
            set_optimizer_state_dict,
        )

        opts = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
        fm = self.trainer.forward_model
        set_model_state_dict(fm, model_state or {}, options=opts)
        set_optimizer_state_dict(fm, self.trainer.optimizer, optim_state or {}, options=opts)

    def leave(self) -> None:
        """Orderly exit with every rank: drop the model, barrier, destroy the group."""
        self.trainer = self.model = None
        gc.collect()
        if dist.is_initialized():
            dist.barrier()
            dist.destroy_process_group()

    def abort(self) -> None:
        """Leave the group at once after a failure: peers waiting in a collective with this
        rank fail now (their gloo pairs close) instead of at the timeout.

        The wrapped model (and through it the process group) is never freed: a failure can
        leave gloo work queued, and freeing the group then deadlocks (its destructor joins
        the gloo threads holding the GIL while a thread finishing that work needs the GIL to
        free it; seen in the full test suite). A failed trainer is not reused, so this keeps
        one replica per failure in memory until the process exits."""
        if self.trainer is not None:
            keep_forever(self.trainer)
        if dist.is_initialized():
            try:
                dist.destroy_process_group()
            except RuntimeError:  # already failing; the peers see the closed pairs either way
                pass


def keep_forever(obj) -> None:
    """One extra reference the interpreter never drops, not even when it clears modules at
    exit (where a module-level list would be emptied)."""
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(obj))


class RankServer:
    """A worker rank (1..W-1): builds its replica, then runs rank 0's commands in order and
    answers (kind, value): ("ok", step stats or None) or ("error", text). After an error it
    has left the group; the trainer it belongs to is closed by rank 0."""

    def __init__(self, spec: RankSpec, rank: int):
        torch.set_num_threads(spec.threads)
        if spec.trace:
            trace.start(spec.trace_dir, f"rank-{rank}")
        self.rank = Rank(spec, rank, build_replica(spec))

    def handle(self, cmd: str, arg) -> tuple[str, Any]:
        r = self.rank
        try:
            if cmd == "join":
                r.join()
            elif cmd == "step":
                with trace.span("rank_step", cat="loop"):
                    stats = r.step(*arg)
                return "ok", {**stats, **({"_trace": trace.drain()} if trace.enabled() else {})}
            elif cmd == "export":
                r.export()  # the weights stay here: rank 0 has gathered them
            elif cmd == "gather":
                r.gather()
            elif cmd == "push":
                r.push()
            elif cmd == "close":
                r.leave()
            else:
                raise ValueError(f"unknown trainer rank command {cmd!r}")
            return "ok", None
        except Exception as e:
            r.abort()
            return "error", describe(e)


def describe(e: BaseException) -> str:
    """'Type: message' and the traceback, for rank 0's error."""
    return f"{type(e).__name__}: {e}\n" + "".join(traceback.format_exception(e)[-12:])
