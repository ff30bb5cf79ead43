"""A decode-time forward for the decoder families traingym covers, used by the built-in engine.

On a CPU at decode batch sizes Hugging Face's forward is dominated by per-op overhead and a slow
bf16 attention kernel for one-token queries. This runs the same maths with fused projections (q|k|v,
gate|up), a preallocated KV cache and decode attention as two batched matmuls with an fp32 softmax.
Weights are views of the HF model's tensors, rebuilt by `refresh`; on a CPU with oneDNN they are
pre-packed once per refresh: a plain bf16 `F.linear` reorders the weight on every call (same
kernel, bitwise-identical results), and in fp32 oneDNN's packed kernel beats MKL's at decode
batch sizes (a second copy of the weights; results round differently from F.linear's, ~1e-6).
bf16 weights on a CPU with AMX go to rollout/amx.py's kernel instead (in-features a multiple of
32): no fixed cost per call, and each row gets the bits oneDNN gives it alone, whatever the
batch (oneDNN's own sums change order above 32 rows, so there the two differ in rare elements).
Covered: the families of models/families.py as transformers ships them (biases, tied embeddings,
sliding windows as HF masks them, RoPE types fixed at load: default, linear, llama3, yarn);
the sparse MoE blocks of Qwen3-MoE, Mixtral and Qwen2-MoE (rollout/fused_moe.py). With `routes`
set to a list, each forward appends the experts it chose, (rows x positions, MoE layers, k), for the
engine's routing record (models/moe.py).
Not covered (`unsupported` names the reason; the engine then decodes with HF's forward): other
model_types (Phi, OLMo, multimodal `gemma3`, other MoE layouts ...), dynamic/longrope RoPE,
bidirectional attention. fp32 logits match HF to ~1e-5, bf16 rounds differently
(tests/models/test_families.py); only CPU is tested.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

from traingym.models.families import covered_model_types, family_of, layer_windows
from traingym.models.moe import route_dtype
from traingym.rollout import amx
from traingym.rollout.fused_moe import (MoeWeights, is_sparse, moe_mlp, moe_weights,
                                        unsupported_block)

STATIC_ROPE = ("default", "linear", "llama3", "yarn")  # inv_freq fixed when the model is built


def _rope_types(model) -> dict[str | None, str]:
    """{layer type (None: one RoPE for all layers): rope_type} of the model's rotary module."""
    rope_type = model.model.rotary_emb.rope_type
    return dict(rope_type) if isinstance(rope_type, dict) else {None: rope_type}


def unsupported(model) -> str | None:
    """Why the fused path cannot run `model` exactly as HF does, or None when it can."""
    c = model.config
    family = family_of(c.model_type)
    if family is None:
        return (f"model_type {c.model_type!r} is not a covered family (covered: "
                f"{', '.join(covered_model_types())})")
    inner = getattr(model, "model", None)
    if inner is None or not hasattr(inner, "layers") or not hasattr(model, "lm_head"):
        return f"{type(model).__name__} is not a causal LM with model.layers and lm_head"
    if getattr(c, "use_bidirectional_attention", False):
        return "use_bidirectional_attention=True (not causal)"
    from transformers.activations import ACT2FN

    act = getattr(c, family.activation_attr, None)
    if act not in ACT2FN:
        return f"activation {family.activation_attr}={act!r} is not one transformers knows"
    dynamic = sorted({t for t in _rope_types(model).values() if t not in STATIC_ROPE})
    if dynamic:
        return (f"RoPE type {dynamic} recomputes its frequencies with the sequence length "
                f"(covered: {', '.join(STATIC_ROPE)})")
    for layer in inner.layers:
        if not (is_sparse(layer.mlp) or hasattr(layer.mlp, "gate_proj")):
            return (f"{type(layer.mlp).__name__} is neither a gated MLP nor a sparse MoE "
                    "block with fused 3-D experts (rollout/fused_moe.py)")
        if is_sparse(layer.mlp) and unsupported_block(layer.mlp):
            return unsupported_block(layer.mlp)
    return None


def supports(model) -> bool:
    return unsupported(model) is None


def packing_pays(weight: torch.Tensor) -> bool:
    """fp32 weights on a CPU with oneDNN, or bf16 ones where its build has bf16 kernels."""
    if weight.device.type != "cpu" or not torch.backends.mkldnn.is_available():
        return False
    if weight.dtype == torch.float32:
        return True
    return weight.dtype == torch.bfloat16 and torch.ops.mkldnn._is_mkldnn_bf16_supported()


class _Layer(NamedTuple):
    ln1: torch.Tensor
    qkv_w: torch.Tensor
    qkv_b: torch.Tensor | None
    o_w: torch.Tensor
    o_b: torch.Tensor | None
    ln2: torch.Tensor  # before the MLP (Llama: post_attention_layernorm; Gemma 2/3: pre_ff)
    gu_w: torch.Tensor
    gu_b: torch.Tensor | None
    down_w: torch.Tensor
    down_b: torch.Tensor | None
    qk_norm: torch.Tensor | None  # Qwen3, Gemma 3: RMSNorm over each head, (H + KV, 1, D):
    # q_norm's weight for the query heads, k_norm's for the key heads (one call for both)
    post_attn: torch.Tensor | None  # Gemma 2/3 sandwich norms, on the sublayers' outputs
    post_ff: torch.Tensor | None
    window: int | None  # sliding window, None: full attention
    rope: str | None  # which RoPE (Gemma 3: per layer type)
    scale: float
    softcap: float | None  # attention logit soft-capping (Gemma 2)
    moe: MoeWeights | None = None  # a sparse MoE block (gu_w ... down_b None then)


def _cat_bias(*linears) -> torch.Tensor | None:
    biases = [m.bias for m in linears]
    if all(b is None for b in biases):
        return None
    return torch.cat([b if b is not None else m.weight.new_zeros(m.out_features)
                      for b, m in zip(biases, linears)])


class FusedDecoder:
    def __init__(self, model):
        reason = unsupported(model)
        if reason is not None:
            raise ValueError(f"FusedDecoder does not cover this model: {reason}")
        self.model = model
        c = model.config
        self.family = family_of(c.model_type)
        self.n_heads, self.n_kv = c.num_attention_heads, c.num_key_value_heads
        self.head_dim = model.model.layers[0].self_attn.head_dim
        self.eps = c.rms_norm_eps
        self.gemma_norm = self.family.norm == "gemma"
        self.final_softcap = getattr(c, "final_logit_softcapping", None)
        self.windows = layer_windows(c, self.family)
        self.window_sizes = sorted({w for w in self.windows if w is not None})
        rot = model.model.rotary_emb
        self.ropes = {}  # rope key -> (inv_freq fp32, attention scaling)
        for kind in _rope_types(model):
            prefix = f"{kind}_" if kind is not None else ""
            self.ropes[kind] = (getattr(rot, f"{prefix}inv_freq").float(),
                                float(getattr(rot, f"{prefix}attention_scaling")))
        types = getattr(c, "layer_types", None)
        self.layer_ropes = [types[i] if None not in self.ropes else None
                            for i in range(c.num_hidden_layers)]
        self.routes: list[torch.Tensor] | None = None  # a list: record each forward's routes
        self.refresh()

    def _prepare(self, w: torch.Tensor) -> torch.Tensor | amx.Packed:
        if self.kernel and amx.fits(w.shape[1]):
            return amx.pack(w)
        return torch.ops.mkldnn._reorder_linear_weight(w, 16) if self.packed else w

    def _linear(self, x: torch.Tensor, w: torch.Tensor | amx.Packed,
                b: torch.Tensor | None = None):
        if isinstance(w, amx.Packed):
            return amx.linear(x, w, b)
        if self.packed:
            return torch.ops.mkldnn._linear_pointwise(x, w, b, "none", [], "")
        return F.linear(x, w, b)

    def _norm_weight(self, module) -> torch.Tensor:
        """Llama: the weight as is; Gemma: (1 + w) in fp32, as Gemma's RMSNorm multiplies."""
        return 1.0 + module.weight.float() if self.gemma_norm else module.weight

    def _qk_norm(self, q_w: torch.Tensor, k_w: torch.Tensor) -> torch.Tensor:
        D = self.head_dim
        return torch.cat([q_w.expand(self.n_heads, D), k_w.expand(self.n_kv, D)])[:, None, :]

    def release(self) -> None:
        """Drop the fused and pre-packed weights (a second copy of the model where packing
        pays) until the next `refresh`; a prefill or decode before then refreshes first."""
        self.layers, self.lm_head = None, None

    @torch.no_grad()
    def refresh(self) -> None:
        """Rebuild the fused (and, where it pays, pre-packed) weights from the HF model's current
        parameters."""
        from transformers.activations import ACT2FN

        self.release()  # the old copies go before the new ones are made
        emb = self.model.model.embed_tokens
        self.embed = emb.weight
        scale = getattr(emb, "embed_scale", None)  # Gemma: sqrt(hidden), in the weight dtype
        self.embed_scale = scale.to(self.embed.dtype) if scale is not None else None
        self.packed = packing_pays(self.embed)
        self.kernel = (self.packed and self.embed.dtype == torch.bfloat16 and amx.runs())
        act = getattr(self.model.config, self.family.activation_attr)
        self.act = F.silu if act == "silu" else ACT2FN[act]
        pre, nw = self._prepare, self._norm_weight
        self.layers = []
        for i, layer in enumerate(self.model.model.layers):
            a, m = layer.self_attn, layer.mlp
            sandwich = hasattr(layer, "pre_feedforward_layernorm")
            q_norm = getattr(a, "q_norm", None)
            sparse = moe_weights(m, pre, self.act) if is_sparse(m) else None
            if sparse is None:
                gu_w, gu_b = pre(torch.cat([m.gate_proj.weight, m.up_proj.weight])), \
                    _cat_bias(m.gate_proj, m.up_proj)
                down_w, down_b = pre(m.down_proj.weight), m.down_proj.bias
            else:
                gu_w = gu_b = down_w = down_b = None
            self.layers.append(_Layer(
                nw(layer.input_layernorm),
                pre(torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight])),
                _cat_bias(a.q_proj, a.k_proj, a.v_proj),
                pre(a.o_proj.weight), a.o_proj.bias,
                nw(layer.pre_feedforward_layernorm if sandwich else layer.post_attention_layernorm),
                gu_w, gu_b, down_w, down_b,
                self._qk_norm(nw(q_norm), nw(a.k_norm)) if q_norm is not None else None,
                nw(layer.post_attention_layernorm) if sandwich else None,
                nw(layer.post_feedforward_layernorm) if sandwich else None,
                self.windows[i], self.layer_ropes[i], float(a.scaling),
                a.attn_logit_softcapping if self.family.attn_softcap else None, sparse,
            ))
        sparse = [x.moe for x in self.layers if x.moe is not None]
        self.route_dtype = route_dtype(sparse[0].n_experts) if sparse else None
        self.norm = nw(self.model.model.norm)
        self.lm_head = pre(self.model.lm_head.weight)
        self.lm_head_bias = self.model.lm_head.bias

    def _rms(self, x, w):
        x32 = x.float()
        normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        if self.gemma_norm:  # (x^ * (1 + w)) in fp32, then the input dtype
            return (normed * w).to(x.dtype)
        return w * normed.to(x.dtype)

    def _rope(self, pos_B_T, dtype):
        out = {}
        for kind, (inv_freq, scaling) in self.ropes.items():
            freqs = pos_B_T[..., None].float() * inv_freq
            emb = torch.cat([freqs, freqs], -1)
            out[kind] = ((emb.cos() * scaling).to(dtype)[:, None],
                         (emb.sin() * scaling).to(dtype)[:, None])
        return out

    @staticmethod
    def _rotate(x, cos, sin):
        half = x.shape[-1] // 2
        return x * cos + torch.cat([-x[..., half:], x[..., :half]], -1) * sin

    def _embed(self, ids):
        h = F.embedding(ids, self.embed)
        return h * self.embed_scale if self.embed_scale is not None else h

    def _masks(self, full, start: int, T: int, S: int):
        """{window: mask} for every window the layers use (None: full attention), for queries
        at cache slots start..start+T-1 over key slots 0..S-1. The query at slot q sees key
        slots q-W+1..q (HF: kv_idx > q_idx - sliding_window)."""
        masks = {None: full}
        for w in self.window_sizes:
            dist_T_S = (torch.arange(start, start + T, device=full.device)[:, None]
                        - torch.arange(S, device=full.device)[None, :])
            masks[w] = full & (dist_T_S < w)
        return masks

    @torch.no_grad()
    def prefill(self, ids_B_T, mask_B_T, pos_B_T, capacity: int):
        """Run prompts (left-padded); return last-position logits and a cache of `capacity`."""
        if self.layers is None:
            self.refresh()
        B, T = ids_B_T.shape
        kw = {"dtype": self.embed.dtype, "device": self.embed.device}
        cache = [(torch.zeros(B, self.n_kv, capacity, self.head_dim, **kw),
                  torch.zeros(B, self.n_kv, capacity, self.head_dim, **kw))
                 for _ in self.layers]
        dev = ids_B_T.device
        causal = torch.ones(T, T, dtype=torch.bool, device=dev).tril()
        attn_mask = causal[None, None] & mask_B_T.bool()[:, None, None, :]
        attn_mask = attn_mask | torch.eye(T, dtype=torch.bool, device=dev)[None, None]  # no NaN
        h = self._layers(self._embed(ids_B_T), pos_B_T, cache, 0,
                         self._masks(attn_mask, 0, T, T))
        return self._logits(h[:, -1]), cache

    @torch.no_grad()
    def decode(self, tok_B, pos_B, cache, length: int, mask_B_S):
        """One token per row at cache slot `length`; mask_B_S covers slots 0..length. Attention
        runs over the whole preallocated cache (contiguous, so no copies), masking later slots."""
        if self.layers is None:
            self.refresh()
        h = self._embed(tok_B[:, None])
        capacity = cache[0][0].shape[2]
        mask_B_C = F.pad(mask_B_S.bool(), (0, capacity - mask_B_S.shape[1]), value=False)
        masks = self._masks(mask_B_C[:, None, None, :], length, 1, capacity)
        h = self._layers(h, pos_B[:, None], cache, length, masks)
        return self._logits(h[:, -1])

    @torch.no_grad()
    def decode_rows(self, tok_B, pos_B, cache, slot_B, first_B):
        """One token per row, each row at its own cache slot (continuous batching,
        rollout/continuous.py): row b writes slot slot_B[b] and attends to its slots
        first_B[b]..slot_B[b]. `cache` may be views over the first rows and slots of a larger
        cache (writes go through to it)."""
        if self.layers is None:
            self.refresh()
        h = self._embed(tok_B[:, None])
        S = cache[0][0].shape[2]
        slots_S = torch.arange(S, device=tok_B.device)
        full_B_S = (slots_S >= first_B[:, None]) & (slots_S <= slot_B[:, None])
        masks = {None: full_B_S[:, None, None, :]}
        for w in self.window_sizes:  # the query at slot q sees key slots q-W+1..q
            masks[w] = (full_B_S & (slot_B[:, None] - slots_S < w))[:, None, None, :]
        h = self._layers(h, pos_B[:, None], cache, slot_B, masks)
        return self._logits(h[:, -1])

    def _layers(self, h, pos_B_T, cache, start, masks):
        """`start`: the cache slot of the first of the T tokens, one int for all rows, or a
        (B,) tensor of one slot per row (then T == 1)."""
        B, T, _ = h.shape
        H, KV, D = self.n_heads, self.n_kv, self.head_dim
        rms, linear, rotate = self._rms, self._linear, self._rotate
        ropes = self._rope(pos_B_T, h.dtype)
        end = start + T if isinstance(start, int) else None
        routes = []  # the experts each MoE layer chose, (B*T, k)
        for (ln1, qkv_w, qkv_b, o_w, o_b, ln2, gu_w, gu_b, down_w, down_b, qk_norm,
             post_attn, post_ff, window, rope, scale, softcap, sparse), (k_cache, v_cache) in zip(
                self.layers, cache):
            qkv = linear(rms(h, ln1), qkv_w, qkv_b).view(B, T, H + 2 * KV, D).transpose(1, 2)
            qk, v = qkv[:, : H + KV], qkv[:, H + KV :]  # queries and keys: one norm, one RoPE
            if qk_norm is not None:
                qk = rms(qk, qk_norm)
            qk = rotate(qk, *ropes[rope])
            q, k = qk[:, :H], qk[:, H:]
            if isinstance(start, torch.Tensor):  # one token per row, each at its own slot
                rows_B = torch.arange(B, device=h.device)
                k_cache[rows_B, :, start] = k[:, :, 0]
                v_cache[rows_B, :, start] = v[:, :, 0]
            else:
                k_cache[:, :, start:end] = k
                v_cache[:, :, start:end] = v
            mask = masks[window]
            if T == 1 and mask.shape[-1] == k_cache.shape[2]:
                # a decode step: over the whole (contiguous) cache, unfilled slots masked out
                # (a one-token prefill's mask covers its slot only: the branches below)
                if self.kernel and softcap is None and amx.attention_fits(q, k_cache, v_cache):
                    att = amx.decode_attention(q, k_cache, v_cache, mask, scale)
                else:
                    att = self._decode_attention(q, k_cache, v_cache, mask, scale, softcap)
            elif softcap is None:
                att = F.scaled_dot_product_attention(
                    q, k_cache[:, :, :end], v_cache[:, :, :end], attn_mask=mask, scale=scale,
                    enable_gqa=H != KV)
            else:
                att = self._capped_attention(q, k_cache[:, :, :end], v_cache[:, :, :end], mask,
                                             scale, softcap)
            out = linear(att.transpose(1, 2).reshape(B, T, H * D), o_w, o_b)
            h = h + (rms(out, post_attn) if post_attn is not None else out)
            if sparse is not None:
                out, ids_N_K = moe_mlp(rms(h, ln2), sparse, self.act, linear)
                routes.append(ids_N_K)
            else:
                gate, up = linear(rms(h, ln2), gu_w, gu_b).chunk(2, -1)
                out = linear(self.act(gate) * up, down_w, down_b)
            h = h + (rms(out, post_ff) if post_ff is not None else out)
        if self.routes is not None and routes:
            self.routes.append(torch.stack(routes, 1).to(self.route_dtype))
        return h

    @staticmethod
    def _decode_attention(q_B_H_1_D, k_B_KV_S_D, v_B_KV_S_D, mask_B_1_1_S, scale, softcap):
        B, H, _, D = q_B_H_1_D.shape
        KV = k_B_KV_S_D.shape[1]
        q = q_B_H_1_D.view(B, KV, H // KV, D)
        scores = torch.matmul(q, k_B_KV_S_D.transpose(-1, -2)).float() * scale  # (B, KV, G, S)
        if softcap is not None:
            scores = torch.tanh(scores / softcap) * softcap
        scores = scores.masked_fill(~mask_B_1_1_S, float("-inf"))
        out = torch.matmul(scores.softmax(-1).to(v_B_KV_S_D.dtype), v_B_KV_S_D)  # (B, KV, G, D)
        return out.view(B, H, 1, D)

    @staticmethod
    def _capped_attention(q_B_H_T_D, k_B_KV_S_D, v_B_KV_S_D, mask_B_1_T_S, scale, softcap):
        """Prefill attention with soft-capped scores (SDPA has no soft-cap), as HF's eager."""
        H, KV = q_B_H_T_D.shape[1], k_B_KV_S_D.shape[1]
        k = k_B_KV_S_D.repeat_interleave(H // KV, 1)
        v = v_B_KV_S_D.repeat_interleave(H // KV, 1)
        scores = torch.matmul(q_B_H_T_D, k.transpose(-1, -2)) * scale
        scores = torch.tanh(scores / softcap) * softcap
        scores = scores.masked_fill(~mask_B_1_T_S, float("-inf"))
        return torch.matmul(scores.softmax(-1, dtype=torch.float32).to(v.dtype), v)

    def _logits(self, h_B_D):
        logits = self._linear(self._rms(h_B_D, self.norm), self.lm_head, self.lm_head_bias)
        if self.final_softcap is not None:
            logits = torch.tanh(logits / self.final_softcap) * self.final_softcap
        return logits.float()
