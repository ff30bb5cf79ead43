"""The built-in engine's AMX kernels (_amx.c): bf16 linears, a sparse MoE block's routed
experts, and one decode step's attention, for the fused decoder (rollout/fused_decoder.py,
rollout/fused_moe.py).

Why: at decode batch sizes a bf16 matmul costs reading its weight once, but oneDNN's
`_linear_pointwise` adds ~35 us of fixed cost per call on the machines this was built on (a 64 x
64 weight: benchmarks/amx_kernels.py), a MoE block's Python loop over its experts adds its own,
and the decode attention's bf16 `bmm` another. The kernels read weights packed for AMX (`pack`),
run with the GIL released on torch's own OpenMP threads, and compute a MoE block's experts in
one call. Up to 32 rows they give oneDNN's bits, and each row's bits do not depend on its batch
(tests/unit/test_amx.py, tests/moe/test_fused_moe.py); above 32 rows oneDNN sums in another
order, so there the two differ in rare elements by one bf16 step.

`runs()`: the module was built (setup.py; skipped where no C compiler is found), the CPU has
AMX-BF16 and AVX-512 F/BW/VL and Linux grants tile data, and TRAINGYM_NATIVE is not "0".
Elsewhere the fused decoder keeps its oneDNN and torch paths.
"""

from __future__ import annotations

import os
from typing import NamedTuple

import torch
import torch.nn.functional as F

try:
    from traingym.rollout import _amx as lib
except ImportError:  # built without a C compiler
    lib = None
if os.environ.get("TRAINGYM_NATIVE", "1") == "0":
    lib = None


def runs() -> bool:
    return lib is not None and lib.supported()


def fits(in_features: int) -> bool:
    """The kernels take in-features in multiples of 32 (any out-features)."""
    return in_features % 32 == 0


class Packed(NamedTuple):
    data: torch.Tensor  # (..., ceil(N/16), K/2, 16, 2) bf16
    out_features: int
    in_features: int


def pack(w: torch.Tensor) -> Packed:
    """A bf16 weight (..., N, K) in the kernels' layout: each block of 16 output rows one
    contiguous run of K/2 pairs x 16 x 2 (the layout AMX reads), zero rows after the last (a
    copy)."""
    *lead, N, K = w.shape
    pad = -N % 16
    if pad:
        w = F.pad(w, (0, 0, 0, pad))
    data = w.reshape(*lead, (N + pad) // 16, 16, K // 2, 2).transpose(-3, -2).contiguous()
    return Packed(data, N, K)


def linear(x: torch.Tensor, w: Packed, bias: torch.Tensor | None = None) -> torch.Tensor:
    """bf16(x W^T + bias) for bf16 x (..., K) and bias."""
    _bf16(x, bias)
    if x.shape[-1] != w.in_features:
        raise ValueError(f"x has {x.shape[-1]} features, the weight takes {w.in_features}")
    x = x.contiguous()
    bias = bias.contiguous() if bias is not None else None  # held while the kernel reads it
    out = x.new_empty(*x.shape[:-1], w.out_features)
    lib.linear(x.data_ptr(), x.numel() // w.in_features, w.in_features, w.data.data_ptr(),
               w.out_features, 0 if bias is None else bias.data_ptr(), out.data_ptr(),
               torch.get_num_threads())
    return out


def _bf16(*tensors) -> None:
    """The kernels read raw bf16 memory: anything else is refused before it is read."""
    for t in tensors:
        if t is not None and (t.dtype != torch.bfloat16 or t.device.type != "cpu"):
            raise TypeError(f"the AMX kernels take bf16 CPU tensors, got {t.dtype} on {t.device}")


def moe(x_N_H: torch.Tensor, ids_N_K: torch.Tensor, top_N_K: torch.Tensor, gate_up: Packed,
        down: Packed) -> torch.Tensor:
    """A MoE block's routed experts, as fused_moe's expert loop computes them: x (N, H) bf16,
    ids (N, k) the chosen experts, top (N, k) their gate weights (passed as fp32: exact for
    bf16 ones); gate_up and down packed (E, 2I, H) and (E, H, I)."""
    _bf16(x_N_H)
    x_N_H, ids_N_K = x_N_H.contiguous(), ids_N_K.long().contiguous()
    top_N_K = top_N_K.float().contiguous()
    out_N_H = torch.empty_like(x_N_H)
    lib.moe(x_N_H.data_ptr(), x_N_H.shape[0], ids_N_K.data_ptr(), top_N_K.data_ptr(),
            ids_N_K.shape[1], out_N_H.data_ptr(), gate_up.data.shape[0], gate_up.data.data_ptr(),
            down.data.data_ptr(), down.out_features, down.in_features, torch.get_num_threads())
    return out_N_H


def decode_attention(q_B_H_1_D: torch.Tensor, k_B_KV_S_D: torch.Tensor,
                     v_B_KV_S_D: torch.Tensor, mask_B_1_1_S: torch.Tensor,
                     scale: float) -> torch.Tensor:
    """One decode step's attention, as the fused decoder's torch path computes it (scores
    rounded to bf16, an fp32 softmax rounded to bf16, values summed in fp32), over bf16 caches
    whose rows of head_dim are contiguous (views over a larger cache are fine); see
    `attention_fits`."""
    _bf16(q_B_H_1_D, k_B_KV_S_D, v_B_KV_S_D)
    B, H, _, D = q_B_H_1_D.shape
    KV, S = k_B_KV_S_D.shape[1], k_B_KV_S_D.shape[2]
    q = q_B_H_1_D.contiguous()
    mask = mask_B_1_1_S.expand(B, 1, 1, S).reshape(B, S).contiguous()
    out = torch.empty_like(q)
    k, v = k_B_KV_S_D, v_B_KV_S_D
    lib.attention(q.data_ptr(), B, H, KV, D, k.data_ptr(), v.data_ptr(), S, *k.stride()[:3],
                  *v.stride()[:3], mask.data_ptr(), scale, out.data_ptr(),
                  torch.get_num_threads())
    return out


def attention_fits(q_B_H_1_D: torch.Tensor, k_B_KV_S_D: torch.Tensor,
                   v_B_KV_S_D: torch.Tensor) -> bool:
    """Whether `decode_attention` takes these: bf16 caches with contiguous rows, head_dim a
    multiple of 32, at most 16 query heads per key/value head."""
    return (q_B_H_1_D.shape[1] <= 16 * k_B_KV_S_D.shape[1]
            and all(t.dtype == torch.bfloat16 and t.stride(-1) == 1 and t.shape[-1] % 32 == 0
                    for t in (k_B_KV_S_D, v_B_KV_S_D)))
