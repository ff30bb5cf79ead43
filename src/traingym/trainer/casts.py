"""Borrowed casts: the trainer's bf16 forward reads the engine's bf16 weights instead of making
its own.

Under bf16 autocast every linear layer casts its fp32 weight to bf16, and autograd keeps that
cast until the backward: a bf16 copy of the model, live through each micro-batch. In a colocated
run whose engine serves bf16 in place (weights/colocated.py) the engine holds exactly those
casts: the published cast of the trainer's current weights, rounded the same way. `lending`
says which weights can be borrowed; `Borrowing` is the model called with them in place
(torch.func.functional_call), each through `_Lend`, whose backward hands the gradient to the
fp32 weight as autocast's cast does (to fp32), so results are bitwise autocast's
(tests/trainer/test_casts.py). Only weights of nn.Linear layers that share their tensor with no
other parameter (a tied embedding stays the trainer's: the embedding lookup runs in fp32).
"""

from __future__ import annotations

import torch


class _Lend(torch.autograd.Function):
    @staticmethod
    def forward(ctx, master, cast):
        ctx.dtype = master.dtype
        return cast.view_as(cast)

    @staticmethod
    def backward(ctx, grad):
        return grad.to(ctx.dtype), None


def lending(model) -> set[str]:
    """Names of the weights a bf16 autocast forward casts and that can be borrowed: fp32,
    trained, of an nn.Linear, and no other parameter's tensor."""
    owners: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        owners.setdefault(id(p), []).append(name)
    out = set()
    for mod in model.modules():
        if not isinstance(mod, torch.nn.Linear):
            continue
        for attr in ("weight", "bias"):
            p = getattr(mod, attr, None)
            if p is None or not p.requires_grad or p.dtype != torch.float32:
                continue
            names = owners.get(id(p), [])
            if len(names) == 1:
                out.add(names[0])
    return out


class Borrowing:
    """`model` called with `casts[name]` (bf16, equal to its weight cast) in place of each named
    weight; everything else (parameters(), modules, hooks) is the model's own. Make one per
    autocast block (a micro-batch): like autocast's cache, every call in it shares one lent
    tensor per weight, so a weight used by several calls sums its gradient in bf16 before
    the cast back, as autocast does."""

    def __init__(self, model, casts: dict[str, torch.Tensor]) -> None:
        self.model = model
        masters = dict(model.named_parameters())
        self.params = {n: _Lend.apply(masters[n], c) for n, c in casts.items()}

    def __call__(self, *args, **kwargs):
        return torch.func.functional_call(self.model, self.params, args, kwargs, strict=False)

    def __getattr__(self, name):
        return getattr(self.model, name)
