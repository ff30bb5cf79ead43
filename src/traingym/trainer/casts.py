"""Borrowed casts: the trainer's bf16 forward reads the engine's bf16 weights instead of making
its own, and each use's weight gradient goes into `.grad` as soon as the backward reaches it.

Under bf16 autocast every linear layer casts its fp32 weight to bf16, and autograd keeps that
cast until the backward: a bf16 copy of the model, live through each micro-batch. In a colocated
run whose engine serves bf16 in place (weights/colocated.py) the engine holds exactly those
casts: the published cast of the trainer's current weights, rounded the same way. `lending`
says which weights can be borrowed: those of plain nn.Linear layers, a head tied to the
embedding included (the engine's bf16 embedding is its cast; the lookup still reads the fp32
weight). While `Borrowing` is entered the model computes with them; `own_casts` makes the same
casts where no engine lends them, so a run computes the same whether its engine lends or not.

How the gradient comes back. The shared-prompt path (trainer/logprobs.py) calls the model twice
per micro-batch: the prompts, then the completions. Autograd runs a node once all its inputs
have arrived, so a weight used by both calls has its completions' gradient held until the
prompts' backward, much later, adds its own: with autocast's cache (one cast per weight per
block), a bf16 gradient of the whole model at the backward's peak. Here each use of a lent
weight is its own matmul (`_LentMatmul`), whose backward adds the weight's gradient into the
fp32 `.grad` at once, a block of rows at a time (fp32 += bf16, no fp32 copy; a tied head's
vocabulary-sized gradient is never whole), and a plain embedding's lookup adds its rows
(`_Gather`: no dense gradient of the table). benchmarks/memory_phases.py measures the peak.
A weight's uses are then summed in fp32, where autocast sums in bf16: the forward is
autocast's bit for bit, the gradients are to bf16 rounding (bit for bit for a layer used once;
tests/trainer/test_casts.py). `accumulate=False` hands gradients on to autograd instead, for
hooks that must see a weight's whole gradient (the optimizer step in the backward,
trainer/optimizers.py).
"""

from __future__ import annotations

from functools import partial

import torch
import torch.nn.functional as F

CHUNK_ELEMENTS = 1 << 22  # a weight gradient is made and added this many elements at a time


def _add_grad(master: torch.Tensor, rows: slice, grad: torch.Tensor) -> None:
    """master.grad[rows] += grad (fp32 += bf16 converts as it adds: no fp32 copy)."""
    if master.grad is None:
        master.grad = torch.zeros_like(master)
    master.grad[rows].add_(grad)


class _Lend(torch.autograd.Function):
    """A lent tensor in place of its fp32 master. Its gradient goes to the master's `.grad`
    (`accumulate`) or on to autograd, cast to fp32 as autocast's cast does."""

    @staticmethod
    def forward(ctx, master, cast, accumulate: bool):
        ctx.master, ctx.accumulate = master, accumulate
        return cast.view_as(cast)

    @staticmethod
    def backward(ctx, grad):
        if not ctx.accumulate:
            return grad.to(ctx.master.dtype), None, None
        _add_grad(ctx.master, slice(None), grad)
        return None, None, None


class _LentMatmul(torch.autograd.Function):
    """x @ cast.T in bf16, as autocast's linear computes it; the backward adds the weight's
    gradient into the fp32 master's `.grad` a block of rows at a time (a tied head's gradient,
    vocabulary x hidden, is never whole in bf16)."""

    @staticmethod
    def forward(ctx, x, master, cast):
        x = x.to(cast.dtype)
        ctx.master = master
        ctx.save_for_backward(x, cast)
        return F.linear(x, cast)

    @staticmethod
    def backward(ctx, grad):
        x, cast = ctx.saved_tensors
        out, width = cast.shape
        grad_2d, x_2d = grad.reshape(-1, out), x.reshape(-1, width)
        grad_x = None
        if ctx.needs_input_grad[0]:  # 2-D: a batched matmul would expand `cast` per row
            grad_x = (grad_2d @ cast).view(x.shape)
        step = max(1, CHUNK_ELEMENTS // width)
        for start in range(0, out, step):
            rows = slice(start, start + step)
            _add_grad(ctx.master, rows, grad_2d[:, rows].T @ x_2d)
        return grad_x, None, None


class _Gather(torch.autograd.Function):
    """An embedding lookup whose backward adds the looked-up rows' gradients into the weight's
    `.grad` in place: no dense gradient of the whole table beside it."""

    @staticmethod
    def forward(ctx, weight, ids, padding_idx):
        ctx.weight, ctx.padding_idx = weight, padding_idx
        ctx.save_for_backward(ids)
        return F.embedding(ids, weight, padding_idx)

    @staticmethod
    def backward(ctx, grad):
        (ids,) = ctx.saved_tensors
        weight = ctx.weight
        flat, rows = ids.reshape(-1), grad.reshape(-1, grad.shape[-1])
        if ctx.padding_idx is not None:  # nn.Embedding: the padding row gets no gradient
            keep = flat != ctx.padding_idx
            flat, rows = flat[keep], rows[keep]
        if weight.grad is None:
            weight.grad = torch.zeros_like(weight)
        weight.grad.index_add_(0, flat, rows.to(weight.dtype))
        return None, None, None


def _gathering(mod) -> bool:
    """A plain nn.Embedding, trained, whose lookup `_Gather` computes as nn.Embedding does."""
    return (type(mod) is torch.nn.Embedding and mod.weight.requires_grad
            and mod.max_norm is None and not mod.scale_grad_by_freq and not mod.sparse)


def lending(model) -> dict[str, str]:
    """The weights a bf16 autocast forward casts and that can be borrowed: fp32, trained, of a
    plain nn.Linear; each by the name of its use (the layer's) and of its tensor: of the
    parameter names that hold it, the first in sorted order, as the sync names tied weights
    (weights/colocated.py wire_views)."""
    first: dict[int, str] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        first[id(p)] = min(name, first.get(id(p), name))
    out = {}
    for prefix, mod in model.named_modules(remove_duplicate=False):
        if type(mod) is not torch.nn.Linear:
            continue
        for attr in ("weight", "bias"):
            p = getattr(mod, attr, None)
            if p is not None and p.requires_grad and p.dtype == torch.float32:
                out[f"{prefix}.{attr}"] = first[id(p)]
    return out


def own_casts(model, names: set[str]) -> dict[str, torch.Tensor]:
    """The bf16 casts of the named weights, made here (what autocast's cache would hold)."""
    params = dict(model.named_parameters(remove_duplicate=False))
    return {n: params[n].detach().to(torch.bfloat16) for n in names}


def _accumulating_linear(mod, weight, bias, x):
    """nn.Linear's forward on lent casts (None: the layer's own tensor), each use's gradients
    added into the masters' `.grad` by its own backward."""
    y = (_LentMatmul.apply(x, mod.weight, weight) if weight is not None
         else F.linear(x, mod.weight))
    if bias is not None:
        return y + _Lend.apply(mod.bias, bias, True)
    return y + mod.bias.to(y.dtype) if mod.bias is not None else y  # as autocast casts it


def _shared_linear(mod, weight, bias, x):
    """nn.Linear's forward on lent tensors shared by every call (autograd sums their
    gradients and hands them on)."""
    return F.linear(x, weight if weight is not None else mod.weight,
                    bias if bias is not None else mod.bias)


def _gather(mod, ids):
    return _Gather.apply(mod.weight, ids, mod.padding_idx)


class Borrowing:
    """While entered, `model` computes with `casts[name]` (bf16, equal to its weight cast) in
    place of each named weight of a plain nn.Linear (`lending`'s use names); everything else
    (parameters(), modules, hooks) is the model's own. Each lent layer's forward is replaced:
    with `accumulate`, by `_accumulating_linear` (and each plain nn.Embedding's by `_gather`);
    without, by `_shared_linear` over one `_Lend` per weight, whose gradient autograd sums (in
    bf16, as autocast's cache) and hands on. Keep it entered through the backward: gradient
    checkpointing's recompute must run the same forward."""

    def __init__(self, model, casts: dict[str, torch.Tensor], accumulate: bool = True) -> None:
        modules = dict(model.named_modules(remove_duplicate=False))
        lent: dict[str, dict[str, torch.Tensor]] = {}
        for name, cast in casts.items():
            prefix, _, attr = name.rpartition(".")
            if not accumulate:
                cast = _Lend.apply(getattr(modules[prefix], attr), cast, False)
            lent.setdefault(prefix, {})[attr] = cast
        forward = _accumulating_linear if accumulate else _shared_linear
        self.layers = [(modules[p], partial(forward, modules[p], c.get("weight"), c.get("bias")))
                       for p, c in lent.items()]
        if accumulate:
            self.layers += [(mod, partial(_gather, mod)) for mod in model.modules()
                            if _gathering(mod)]

    def __enter__(self) -> Borrowing:
        for mod, forward in self.layers:
            mod.forward = forward
        return self

    def __exit__(self, *exc) -> None:
        for mod, _ in self.layers:
            del mod.forward
