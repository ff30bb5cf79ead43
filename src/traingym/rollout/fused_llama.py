"""A decode-time forward for Llama-architecture models, used by the built-in engine.

Hugging Face's forward is written for generality; on a CPU at decode batch sizes its cost is
dominated by per-op overhead and by a slow bf16 flash-attention kernel for one-token queries.
This module runs the same maths with the projections fused (q|k|v in one matmul, gate|up in
one), a preallocated KV cache, and decode attention as two small batched matmuls with an fp32
softmax. Weights are views of the HF model's own tensors where possible and refreshed after a
weight update (`refresh`). On a CPU with oneDNN bf16 support the bf16 projection weights are
pre-packed once per refresh into oneDNN's blocked layout: a plain bf16 `F.linear` reorders the
weight on every call, which at decode batch sizes costs about as much as the matmul itself
(same kernel, bitwise-identical results; tests/unit/test_engine.py checks).

Covered: `model_type == "llama"` with default RoPE, SiLU MLP, no biases (SmolLM2, Llama 2/3
without RoPE scaling, the tiny test models). Anything else is refused by `supports`, and the
engine then uses the plain HF forward.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def supports(model) -> bool:
    c = model.config
    rope = getattr(c, "rope_parameters", None) or getattr(c, "rope_scaling", None) or {}
    return (c.model_type == "llama" and c.hidden_act == "silu" and not c.attention_bias
            and not getattr(c, "mlp_bias", False) and rope.get("rope_type", "default") == "default")


def packing_pays(weight: torch.Tensor) -> bool:
    """bf16 weights on a CPU whose oneDNN build has bf16 kernels."""
    return (weight.dtype == torch.bfloat16 and weight.device.type == "cpu"
            and torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported())


class FusedLlama:
    def __init__(self, model):
        if not supports(model):
            raise ValueError(f"FusedLlama does not support {model.config.model_type!r} models")
        self.model = model
        c = model.config
        self.n_heads, self.n_kv = c.num_attention_heads, c.num_key_value_heads
        self.head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
        self.eps = c.rms_norm_eps
        rot = model.model.rotary_emb
        self.inv_freq, self.rope_scale = rot.inv_freq.float(), float(rot.attention_scaling)
        self.refresh()

    def _prepare(self, w: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._reorder_linear_weight(w, 16) if self.packed else w

    def _linear(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        if self.packed:
            return torch.ops.mkldnn._linear_pointwise(x, w, None, "none", [], "")
        return F.linear(x, w)

    @torch.no_grad()
    def refresh(self) -> None:
        """Rebuild the fused (and, where it pays, pre-packed) weights from the HF model's current
        parameters."""
        self.embed = self.model.model.embed_tokens.weight
        self.packed = packing_pays(self.embed)
        pre = self._prepare
        self.layers = []
        for layer in self.model.model.layers:
            a, m = layer.self_attn, layer.mlp
            self.layers.append((
                layer.input_layernorm.weight,
                pre(torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight])),
                pre(a.o_proj.weight),
                layer.post_attention_layernorm.weight,
                pre(torch.cat([m.gate_proj.weight, m.up_proj.weight])),
                pre(m.down_proj.weight),
            ))
        self.norm = self.model.model.norm.weight
        self.lm_head = pre(self.model.lm_head.weight)

    def _rms(self, x, w):
        x32 = x.float()
        return w * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype)

    def _rope(self, pos_B_T, dtype):
        freqs = pos_B_T[..., None].float() * self.inv_freq
        emb = torch.cat([freqs, freqs], -1)
        return ((emb.cos() * self.rope_scale).to(dtype)[:, None],
                (emb.sin() * self.rope_scale).to(dtype)[:, None])

    @staticmethod
    def _rotate(x, cos, sin):
        half = x.shape[-1] // 2
        return x * cos + torch.cat([-x[..., half:], x[..., :half]], -1) * sin

    @torch.no_grad()
    def prefill(self, ids_B_T, mask_B_T, pos_B_T, capacity: int):
        """Run prompts (left-padded); return last-position logits and a cache of `capacity`."""
        B, T = ids_B_T.shape
        dtype = self.embed.dtype
        cache = [(torch.zeros(B, self.n_kv, capacity, self.head_dim, dtype=dtype),
                  torch.zeros(B, self.n_kv, capacity, self.head_dim, dtype=dtype))
                 for _ in self.layers]
        causal = torch.ones(T, T, dtype=torch.bool).tril()
        attn_mask = causal[None, None] & mask_B_T.bool()[:, None, None, :]
        attn_mask = attn_mask | torch.eye(T, dtype=torch.bool)[None, None]  # pad rows: no NaN
        h = self._layers(F.embedding(ids_B_T, self.embed), pos_B_T, cache, 0, attn_mask)
        return self._logits(h[:, -1]), cache

    @torch.no_grad()
    def decode(self, tok_B, pos_B, cache, length: int, mask_B_S):
        """One token per row at cache slot `length`; mask_B_S covers slots 0..length. Attention
        runs over the whole preallocated cache (contiguous, so no copies), masking later slots."""
        h = F.embedding(tok_B[:, None], self.embed)
        capacity = cache[0][0].shape[2]
        mask_B_C = F.pad(mask_B_S.bool(), (0, capacity - mask_B_S.shape[1]), value=False)
        h = self._layers(h, pos_B[:, None], cache, length, mask_B_C[:, None, None, :])
        return self._logits(h[:, -1])

    def _layers(self, h, pos_B_T, cache, start: int, attn_mask):
        B, T, _ = h.shape
        H, KV, D = self.n_heads, self.n_kv, self.head_dim
        cos, sin = self._rope(pos_B_T, h.dtype)
        end = start + T
        for (ln1, qkv_w, o_w, ln2, gu_w, down_w), (k_cache, v_cache) in zip(self.layers, cache):
            x = self._rms(h, ln1)
            qkv = self._linear(x, qkv_w).view(B, T, H + 2 * KV, D).transpose(1, 2)
            q, k, v = qkv[:, :H], qkv[:, H : H + KV], qkv[:, H + KV :]
            k_cache[:, :, start:end] = self._rotate(k, cos, sin)
            v_cache[:, :, start:end] = v
            q = self._rotate(q, cos, sin)
            if T == 1:  # over the whole (contiguous) cache; unfilled slots are masked out
                att = self._decode_attention(q, k_cache, v_cache, attn_mask)
            else:
                att = F.scaled_dot_product_attention(
                    q, k_cache[:, :, :end], v_cache[:, :, :end], attn_mask=attn_mask,
                    enable_gqa=H != KV)
            h = h + self._linear(att.transpose(1, 2).reshape(B, T, H * D), o_w)
            gate, up = self._linear(self._rms(h, ln2), gu_w).chunk(2, -1)
            h = h + self._linear(F.silu(gate) * up, down_w)
        return h

    def _decode_attention(self, q_B_H_1_D, k_B_KV_S_D, v_B_KV_S_D, mask_B_1_1_S):
        B, H, _, D = q_B_H_1_D.shape
        KV = k_B_KV_S_D.shape[1]
        q = q_B_H_1_D.view(B, KV, H // KV, D)
        scores = torch.matmul(q, k_B_KV_S_D.transpose(-1, -2)).float() * D**-0.5  # (B, KV, G, S)
        scores = scores.masked_fill(~mask_B_1_1_S, float("-inf"))
        out = torch.matmul(scores.softmax(-1).to(v_B_KV_S_D.dtype), v_B_KV_S_D)  # (B, KV, G, D)
        return out.view(B, H, 1, D)

    def _logits(self, h_B_D):
        return self._linear(self._rms(h_B_D, self.norm), self.lm_head).float()
