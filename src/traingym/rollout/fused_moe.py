"""The sparse MoE block of the fused decode path (rollout/fused_decoder.py): top-k routing and
the experts' matmuls grouped by expert, as transformers' Qwen3-MoE, Mixtral and Qwen2-MoE blocks
compute them.

Routing: softmax over all experts in fp32, top-k, renormalised over the k where the family does
(Mixtral always, Qwen3-MoE and Qwen2-MoE with `norm_topk_prob`), the gate weights in the dtype
the model's own router returns (Qwen3-MoE, Qwen2-MoE: the model's; Mixtral: fp32, read once from
the router at `refresh`). Experts: the (token, expert) pairs sorted by expert, then per expert
one gate|up and one down matmul over its contiguous run of tokens (the fused 3-D `gate_up_proj`
(E, 2I, H) and `down_proj` (E, H, I) of transformers 5, as views), weighted and added back per
token in expert order, as HF's loop does. Qwen2-MoE's shared expert (a gated MLP over every
token, times sigmoid(shared_expert_gate(x))) is added after the routed experts, as HF's block
adds it. Each call returns the chosen ids, so the engine records routes.

The routed experts run in one of two ways. Where the AMX kernel runs (rollout/amx.py: bf16
weights, a SiLU family, hidden and intermediate sizes multiples of 32, a CPU with AMX-BF16 and
the module built), all the experts of a block are one C call, over a copy of the experts packed
for it at `refresh`; at decode sizes it gives the same bits as the other way
(tests/moe/test_fused_moe.py). Otherwise a Python loop over the experts calls `linear` twice per
expert with a token, over weights `prepare` made (the fused decoder's oneDNN pre-packing where it
pays: a plain bf16 `F.linear` over a 3-D tensor's slice reorders that expert's weight on every
call); that way a batch pays one host sync per MoE layer (the per-expert counts).
Not covered: grouped or biased routers (DeepSeek-V3), router jitter (training only), expert
parallelism, biases in the shared expert (`unsupported_block` refuses them; the engine then
decodes with HF's forward).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

from traingym.rollout import amx


class MoeWeights(NamedTuple):
    router: torch.Tensor  # (E, H)
    n_experts: int
    gate_up: tuple[torch.Tensor, ...]  # per expert (2I, H), as `prepare` returned it
    down: tuple[torch.Tensor, ...]  # per expert (H, I); both empty where `packed` is set
    top_k: int
    renorm: bool  # renormalise the top-k probabilities
    gate_dtype: torch.dtype  # the dtype the model's router returns its gate weights in
    shared: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor] | None = None
    # Qwen2-MoE's shared expert: (gate_proj, up_proj, down_proj, shared_expert_gate) weights
    packed: tuple[amx.Packed, amx.Packed] | None = None  # gate_up, down for the AMX kernel


def is_sparse(mlp) -> bool:
    """A sparse MoE block of the covered layout (a router `gate`, fused 3-D `experts`)."""
    experts = getattr(mlp, "experts", None)
    return (hasattr(mlp, "gate") and experts is not None
            and getattr(experts, "gate_up_proj", None) is not None
            and getattr(experts, "down_proj", None) is not None
            and experts.gate_up_proj.dim() == 3)


def kernel_runs(experts, act) -> bool:
    """Whether the AMX kernel computes these experts (see the module's docstring)."""
    gate_up, down = experts.gate_up_proj, experts.down_proj
    return (act is F.silu and gate_up.dtype == torch.bfloat16 and gate_up.device.type == "cpu"
            and amx.fits(gate_up.shape[2]) and amx.fits(down.shape[2]) and amx.runs())


def _same(w: torch.Tensor) -> torch.Tensor:
    return w


@torch.no_grad()
def moe_weights(mlp, prepare=_same, act=None) -> MoeWeights:
    """The block's weights, each matrix passed through `prepare` (the fused decoder's packing
    for `linear`; by default the views of the model's own tensors); the experts packed for the
    AMX kernel instead where it computes them with activation `act`."""
    router = mlp.gate
    probe = router(router.weight.new_zeros(1, router.weight.shape[1]))  # its output dtypes
    shared = None
    if getattr(mlp, "shared_expert", None) is not None:
        e = mlp.shared_expert
        shared = tuple(prepare(w) for w in (e.gate_proj.weight, e.up_proj.weight,
                                            e.down_proj.weight, mlp.shared_expert_gate.weight))
    experts = mlp.experts
    if kernel_runs(experts, act):
        gate_up, down = (), ()
        packed = amx.pack(experts.gate_up_proj), amx.pack(experts.down_proj)
    else:
        gate_up = tuple(prepare(w) for w in experts.gate_up_proj)
        down = tuple(prepare(w) for w in experts.down_proj)
        packed = None
    return MoeWeights(prepare(router.weight), router.weight.shape[0], gate_up, down,
                      router.top_k, getattr(router, "norm_topk_prob", True), probe[1].dtype,
                      shared, packed)


def unsupported_block(mlp) -> str | None:
    """Why moe_mlp cannot compute this sparse block as HF does, or None when it can."""
    e = getattr(mlp, "shared_expert", None)
    if e is None:
        return None
    if getattr(mlp, "shared_expert_gate", None) is None:
        return f"{type(mlp).__name__} has a shared expert without a shared_expert_gate"
    linears = (e.gate_proj, e.up_proj, e.down_proj, mlp.shared_expert_gate)
    if any(getattr(m, "bias", None) is not None for m in linears):
        return f"{type(mlp).__name__}'s shared expert has biases"
    return None


def moe_mlp(x_B_T_H: torch.Tensor, w: MoeWeights, act,
            linear=F.linear) -> tuple[torch.Tensor, torch.Tensor]:
    """(the block's output (B, T, H), the experts chosen (B*T, k)); `linear(x, weight)` takes
    the weights as `moe_weights`' `prepare` made them."""
    B, T, H = x_B_T_H.shape
    x_N_H = x_B_T_H.reshape(-1, H)
    probs_N_E = linear(x_N_H, w.router).float().softmax(-1)
    top_N_K, ids_N_K = torch.topk(probs_N_E, w.top_k, dim=-1)
    if w.renorm:
        top_N_K = top_N_K / top_N_K.sum(-1, keepdim=True)
    top_N_K = top_N_K.to(w.gate_dtype)
    if w.packed is not None:
        out_N_H = amx.moe(x_N_H, ids_N_K, top_N_K, *w.packed)
    else:
        out_N_H = _looped_experts(x_N_H, ids_N_K, top_N_K, w, act, linear)
    if w.shared is not None:  # HF: routed + sigmoid(gate(x)) * shared_expert(x)
        g_w, u_w, d_w, sg_w = w.shared
        shared_N_H = linear(act(linear(x_N_H, g_w)) * linear(x_N_H, u_w), d_w)
        out_N_H = out_N_H + torch.sigmoid(linear(x_N_H, sg_w)) * shared_N_H
    return out_N_H.view(B, T, H), ids_N_K


def _looped_experts(x_N_H, ids_N_K, top_N_K, w: MoeWeights, act, linear) -> torch.Tensor:
    """HF's order: the (token, slot) pairs sorted by expert, each expert over its rows, each
    output times its gate weight, summed per token in expert order (index_add_ into a bf16
    tensor sums in fp32 and rounds once)."""
    flat = ids_N_K.reshape(-1)
    order = flat.argsort(stable=True)
    token = order // w.top_k
    xs = x_N_H[token]
    outs, start = [], 0
    for e, n in enumerate(torch.bincount(flat, minlength=w.n_experts).tolist()):
        if n == 0:
            continue
        gate, up = linear(xs[start:start + n], w.gate_up[e]).chunk(2, -1)
        outs.append(linear(act(gate) * up, w.down[e]))
        start += n
    y = torch.cat(outs) * top_N_K.reshape(-1)[order, None]
    return torch.zeros_like(x_N_H).index_add_(0, token, y.to(x_N_H.dtype))

