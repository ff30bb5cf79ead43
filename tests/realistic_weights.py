"""Realistic weight streams for tests and benchmarks: the bf16 states an engine receives.

A causal LM keeps fp32 master weights; each step runs AdamW at an RL learning rate on a
policy-gradient surrogate (random +-1 advantages on sampled token sequences) and casts the
result to bf16, which is what gets published. This reproduces the statistics that matter to
the codec (which elements change, by how many ulps) without a reward model or rollouts;
it is not an RL run (the loss teaches nothing).
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from traingym.weights.base import State


def tiny_llama(hidden: int = 64, layers: int = 2, vocab: int = 512, seed: int = 0):
    """A small LlamaForCausalLM built offline (about 0.2M params with the defaults)."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=hidden * 3,
                      num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=256, tie_word_embeddings=True)
    return AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)


def rl_states(model, steps: int, lr: float = 3e-6, batch: int = 4, seq: int = 64,
              seed: int = 0, dtype: torch.dtype = torch.bfloat16) -> Iterator[State]:
    """Yield `steps + 1` states cast to `dtype`: the initial one, then one per AdamW step."""
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    vocab = model.config.vocab_size

    def export() -> State:
        return {k: v.detach().to(dtype).contiguous() for k, v in model.state_dict().items()}

    yield export()
    for _ in range(steps):
        tokens_B_T = torch.randint(0, vocab, (batch, seq), generator=gen)
        adv_B = torch.randint(0, 2, (batch,), generator=gen).float() * 2 - 1
        logits_B_T_V = model(input_ids=tokens_B_T).logits[:, :-1]
        logp_B_T = torch.log_softmax(logits_B_T_V.float(), -1).gather(
            -1, tokens_B_T[:, 1:, None]).squeeze(-1)
        loss = -(adv_B[:, None] * logp_B_T).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        yield export()
