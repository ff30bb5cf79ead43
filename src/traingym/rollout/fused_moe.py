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
Not covered: grouped or biased routers (DeepSeek-V3), router jitter (training only), expert
parallelism, biases in the shared expert (`unsupported_block` refuses them; the engine then
decodes with HF's forward); the experts' weights are not pre-packed for oneDNN and a batch pays
one host sync per MoE layer (the per-expert counts).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F


class MoeWeights(NamedTuple):
    router: torch.Tensor  # (E, H)
    gate_up: torch.Tensor  # (E, 2I, H)
    down: torch.Tensor  # (E, H, I)
    top_k: int
    renorm: bool  # renormalise the top-k probabilities
    gate_dtype: torch.dtype  # the dtype the model's router returns its gate weights in
    shared: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor] | None = None
    # Qwen2-MoE's shared expert: (gate_proj, up_proj, down_proj, shared_expert_gate) weights


def is_sparse(mlp) -> bool:
    """A sparse MoE block of the covered layout (a router `gate`, fused 3-D `experts`)."""
    experts = getattr(mlp, "experts", None)
    return (hasattr(mlp, "gate") and experts is not None
            and getattr(experts, "gate_up_proj", None) is not None
            and getattr(experts, "down_proj", None) is not None
            and experts.gate_up_proj.dim() == 3)


@torch.no_grad()
def moe_weights(mlp) -> MoeWeights:
    router = mlp.gate
    probe = router(router.weight.new_zeros(1, router.weight.shape[1]))  # its output dtypes
    shared = None
    if getattr(mlp, "shared_expert", None) is not None:
        e = mlp.shared_expert
        shared = (e.gate_proj.weight, e.up_proj.weight, e.down_proj.weight,
                  mlp.shared_expert_gate.weight)
    return MoeWeights(router.weight, mlp.experts.gate_up_proj, mlp.experts.down_proj,
                      router.top_k, getattr(router, "norm_topk_prob", True), probe[1].dtype,
                      shared)


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


def moe_mlp(x_B_T_H: torch.Tensor, w: MoeWeights, act) -> tuple[torch.Tensor, torch.Tensor]:
    """(the block's output (B, T, H), the experts chosen (B*T, k))."""
    B, T, H = x_B_T_H.shape
    x_N_H = x_B_T_H.reshape(-1, H)
    probs_N_E = F.linear(x_N_H, w.router).float().softmax(-1)
    top_N_K, ids_N_K = torch.topk(probs_N_E, w.top_k, dim=-1)
    if w.renorm:
        top_N_K = top_N_K / top_N_K.sum(-1, keepdim=True)
    top_N_K = top_N_K.to(w.gate_dtype)
    flat = ids_N_K.reshape(-1)
    order = flat.argsort(stable=True)  # (token, slot) pairs, grouped by expert
    token = order // w.top_k
    xs = x_N_H[token]
    outs, start = [], 0
    for e, n in enumerate(torch.bincount(flat, minlength=w.router.shape[0]).tolist()):
        if n == 0:
            continue
        gate, up = F.linear(xs[start:start + n], w.gate_up[e]).chunk(2, -1)
        outs.append(F.linear(act(gate) * up, w.down[e]))
        start += n
    y = torch.cat(outs) * top_N_K.reshape(-1)[order, None]
    out_N_H = torch.zeros_like(x_N_H).index_add_(0, token, y.to(x_N_H.dtype))
    if w.shared is not None:  # HF: routed + sigmoid(gate(x)) * shared_expert(x)
        g_w, u_w, d_w, sg_w = w.shared
        shared_N_H = F.linear(act(F.linear(x_N_H, g_w)) * F.linear(x_N_H, u_w), d_w)
        out_N_H = out_N_H + torch.sigmoid(F.linear(x_N_H, sg_w)) * shared_N_H
    return out_N_H.view(B, T, H), ids_N_K
