"""The optimizer step that reports which of the engine's values it changed (`ChangeTracking`), so
the delta sync reads only those elements instead of comparing the whole model with what the
engines hold (weights/sync.py, `changed`).

torch's fused AdamW kernel steps each parameter one cache-sized chunk (`CHUNK` elements) at a
time, on views of the parameter, its gradient and its moments; each chunk is copied just before
its step, while it is in cache, and the positions whose cast to the engine's dtype changed are
kept with the cast bits before and after, so the sync reads neither state. For fp32 weights and
a bf16 engine one C pass rounds and compares both (native.bf16_changes); otherwise torch casts
both and extract.changes compares them. A NaN in a weight stops the record (the sync compares).
The kernel is torch's own on the same values, so weights and moments are bitwise those of
`optimizer.step()` (tests/trainer/test_step_changes.py). Over several steps since
`arm(version)` the positions accumulate (a union) and the sync reads their values itself.
Measured (benchmarks/step_changes.py, 134.5M parameters, one thread): the record adds 0.22 s to
the step and saves the sync's encode 0.16 s, so `trainer.emit_changes` is off by default.
Covered: torch.optim.AdamW with fused=True (the trainer's default), without amsgrad, maximize or
capturable, on plain CPU tensors, and an engine dtype narrower than the parameters'.
Not covered (take() returns None and the sync compares as before): other optimizers (8-bit),
the step inside the backward pass, data-parallel ranks, LoRA, weights changed any other way
since `arm` (`invalidate`).
"""

from __future__ import annotations

import numpy as np
import torch
from torch.optim.adamw import adamw

from traingym.weights import native
from traingym.weights.base import Changed
from traingym.weights.extract import changes
from traingym.weights.hashing import bits

CHUNK = 1 << 18  # elements a step: parameter, gradient and both moments in 4 MiB (in L2/L3)


def trackable(optimizer: torch.optim.Optimizer) -> bool:
    """Whether `ChangeTracking` can step this optimizer exactly as its own step() would."""
    return type(optimizer) is torch.optim.AdamW and all(
        g.get("fused") and not (g["amsgrad"] or g["maximize"] or g["capturable"]
                                or g["differentiable"])
        and all(type(p.data) is torch.Tensor and p.device.type == "cpu" for p in g["params"])
        for g in optimizer.param_groups)


class ChangeTracking:
    """Steps `optimizer` (trackable) a chunk at a time and keeps, per name in `names` (a
    parameter -> its state-dict names, tied ones under each), the flat positions whose cast to
    `dtype` changed since `arm`."""

    def __init__(self, optimizer: torch.optim.Optimizer, names: dict[torch.Tensor, list[str]],
                 dtype: torch.dtype) -> None:
        if not trackable(optimizer):
            raise ValueError("ChangeTracking steps torch's fused AdamW only (trackable())")
        self.optimizer, self.dtype = optimizer, dtype
        self._names = {id(p): n for p, n in names.items()}
        self._base: int | None = None
        self._steps = 0  # steps since arm
        self._found: dict[int, list[tuple]] = {}  # per step: (positions, old bits, new bits)
        self._before = torch.empty(CHUNK, dtype=dtype)
        self._after = torch.empty(CHUNK, dtype=dtype)
        self._before32 = torch.empty(CHUNK, dtype=torch.float32)
        self._lost = False  # a NaN: what changed is not known until the next arm
        self._step = torch.zeros((), dtype=torch.float32)

    def arm(self, version: int) -> None:
        """The parameters now are what `version` published: track changes from here."""
        self._base, self._steps, self._found, self._lost = version, 0, {}, False

    def invalidate(self) -> None:
        """The parameters changed another way: no positions until the next `arm`."""
        self._base, self._steps, self._found = None, 0, {}

    def take(self) -> Changed | None:
        """What changed since `arm` (then tracking stops until the next `arm`), or None where it
        is unknown: positions, with their bits before and after where there was one step."""
        if self._base is None or self._lost:
            self.invalidate()
            return None
        one = self._steps == 1
        positions, old, new = {}, {}, {}
        for pid, found in self._found.items():
            if one:
                pos, a, b = found[0]
            else:
                pos, a, b = np.unique(np.concatenate([f[0] for f in found])), None, None
            for name in self._names.get(pid, ()):
                positions[name], old[name], new[name] = pos, a, b
        out = Changed(self._base, positions, *((old, new) if one else (None, None)))
        self.invalidate()
        return out

    @torch.no_grad()
    def step(self) -> None:
        """optimizer.step(), bitwise, recording the changed positions while armed."""
        opt = self.optimizer
        for group in opt.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = opt.state[p]
                if not state:  # as torch's AdamW: a float32 step count, zero moments
                    state["step"] = torch.zeros((), dtype=torch.float32)
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(p,
                                                           memory_format=torch.preserve_format)
                views = [t.view(-1) for t in (p, p.grad, state["exp_avg"], state["exp_avg_sq"])]
                track = self._base is not None and not self._lost
                fast = (track and self.dtype == torch.bfloat16 and p.dtype == torch.float32
                        and hasattr(native.lib, "bf16_changes"))
                found = []
                for i in range(0, p.numel(), CHUNK):
                    chunk = [v[i : i + CHUNK] for v in views]
                    k = chunk[0].numel()
                    self._step.copy_(state["step"])  # the kernel adds the step's 1 to it
                    if track:
                        (self._before32 if fast else self._before)[:k].copy_(chunk[0])
                    adamw([chunk[0]], [chunk[1]], [chunk[2]], [chunk[3]], [], [self._step],
                          fused=True, amsgrad=False, beta1=beta1, beta2=beta2, lr=group["lr"],
                          weight_decay=group["weight_decay"], eps=group["eps"],
                          maximize=False)
                    if not track:
                        continue
                    if fast:
                        got = native.bf16_changes(self._before32[:k].numpy(), chunk[0].numpy())
                    else:
                        self._after[:k].copy_(chunk[0])
                        got = changes(bits(self._before[:k]), bits(self._after[:k]))
                    if got is None:  # a NaN
                        self._lost = track = fast = False
                    elif got[0].size:
                        found.append((got[0] + i, got[1], got[2]))
                state["step"].add_(1)
                if track and found:
                    self._found.setdefault(id(p), []).append(
                        found[0] if len(found) == 1 else
                        tuple(np.concatenate(x) for x in zip(*found)))
        if self._base is not None:
            self._steps += 1
