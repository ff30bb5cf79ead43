"""Tiny random-init mixture-of-experts models from the real transformers classes (Qwen3-MoE,
Mixtral, Qwen2-MoE with its shared expert), with the tiny tokenizer (models/loader.py), for the
routing tests (tests/moe)."""

from __future__ import annotations

import torch

from traingym.models.loader import tiny_tokenizer


def tiny_moe(family: str = "qwen3_moe", seed: int = 0, router_std: float = 1.0,
             head_dim: int = 16):
    """(model, tokenizer): 2 MoE layers of 8 experts, top-2, fp32. `router_std`: the router
    weights' std (the HF init's 0.02 gives near-uniform routing; 1.0 gives clear choices).
    `head_dim`: 16 (4 heads) or 32 (2 heads, 1 KV head: vLLM-CPU's attention takes >= 32)."""
    from transformers import (MixtralConfig, MixtralForCausalLM, Qwen2MoeConfig,
                              Qwen2MoeForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM)

    tok = tiny_tokenizer()
    common = dict(vocab_size=len(tok), hidden_size=64, num_hidden_layers=2,
                  num_attention_heads=64 // head_dim, num_key_value_heads=32 // head_dim,
                  head_dim=head_dim, num_experts_per_tok=2,
                  max_position_embeddings=256, tie_word_embeddings=False,
                  pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
                  bos_token_id=tok.bos_token_id)
    if family == "qwen3_moe":
        cfg = Qwen3MoeConfig(**common, intermediate_size=128, moe_intermediate_size=32,
                             num_experts=8, norm_topk_prob=True)
        cls = Qwen3MoeForCausalLM
    elif family == "qwen2_moe":
        cfg = Qwen2MoeConfig(**common, intermediate_size=128, moe_intermediate_size=32,
                             shared_expert_intermediate_size=48, num_experts=8,
                             norm_topk_prob=False)
        cls = Qwen2MoeForCausalLM
    else:
        cfg = MixtralConfig(**common, intermediate_size=32, num_local_experts=8)
        cls = MixtralForCausalLM
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = cls(cfg)
        for layer in model.model.layers:
            if hasattr(layer.mlp, "gate"):
                torch.nn.init.normal_(layer.mlp.gate.weight, std=router_std)
            if hasattr(layer.mlp, "shared_expert_gate"):  # HF's init: sigmoid(0) everywhere
                torch.nn.init.normal_(layer.mlp.shared_expert_gate.weight, std=0.5)
    return model.eval(), tok


def save_tiny_moe(folder, family: str = "qwen3_moe", seed: int = 0, head_dim: int = 16) -> str:
    """A tiny MoE saved as a Hugging Face folder (model.path); returns the path."""
    model, tok = tiny_moe(family, seed, head_dim=head_dim)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return str(folder)
