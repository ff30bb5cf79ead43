"""Per-token log-probs of completions, computing each shared prompt once.

The G completions of a group share one prompt: it is run once with a KV cache, the cache is
repeated G times (a differentiable repeat, so every completion's gradient flows back into the
one prompt pass), and only the completion tokens run per sample, and only they go through the
LM head. Log-probs and gradients equal one sequence per sample up to float rounding
(tests/unit/test_logprobs.py). Environment tokens of multi-turn completions run as context;
`loss_masks` zeroes their log-probs and mask entries, so only policy tokens carry loss.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
from transformers import DynamicCache

from traingym.core.padding import left_pad, repeat_cache_rows, right_pad
from traingym.models.scoring import contiguous_head_input, scaled, short_rows_attention


@dataclass
class TokenLogprobs:
    logp_B_T: torch.Tensor  # log-prob of each completion token (0 where masked)
    mask_B_T: torch.Tensor  # 1 for trained (policy) tokens, 0 for env tokens and padding
    entropy_B_T: torch.Tensor  # entropy of the predictive distribution (no grad)
    # with hidden=True: the last hidden state that predicts each token (the LM head's input)
    hidden_B_T_H: torch.Tensor | None = None


@contextlib.contextmanager
def lm_head_inputs(model):
    """Collects the inputs of the model's output layer (its last hidden states, one tensor
    per forward call) while the block runs."""
    seen: list[torch.Tensor] = []
    handle = model.get_output_embeddings().register_forward_hook(
        lambda module, args, out: seen.append(args[0]))
    try:
        yield seen
    finally:
        handle.remove()


def completion_logprobs(
    model,
    prompts: list[tuple[int, ...]],
    completions: list[list[list[int]]],
    temperature: float,
    pad_token_id: int,
    loss_masks: list[list[list[int]]] | None = None,
    entropy_grad: bool = False,
    hidden: bool = False,
) -> TokenLogprobs:
    """Log-probs under softmax(logits / temperature) of completions[p][g] given prompts[p].

    Rows come out prompt-major: row p * G_p + g. Every completion must have at least one token.
    `loss_masks[p][g]` (same shape as completions; None: all ones) marks the tokens to train on.
    `entropy_grad`: the entropy keeps its graph (an entropy bonus in the loss); else no grad.
    `hidden`: also the last hidden state before each token (a value head's input), (B, T, H).
    """
    if hidden:
        with lm_head_inputs(model) as seen:
            out = completion_logprobs(model, prompts, completions, temperature, pad_token_id,
                                      loss_masks, entropy_grad)
        ns = torch.tensor([len(c) for c in completions], device=seen[0].device)
        parts = [seen[0][:, -1:].repeat_interleave(ns, dim=0), *seen[1:]]
        out.hidden_B_T_H = torch.cat(parts, dim=1)
        return out
    device = next(model.parameters()).device
    flat = [c for group in completions for c in group]
    if any(len(c) == 0 for c in flat):
        raise ValueError("completion_logprobs: every completion needs at least one token")
    ids_P_L, mask_P_L = left_pad(prompts, pad_token_id, device)
    comp_B_C, cmask_B_C = right_pad(flat, pad_token_id, device)
    row_tokens = ids_P_L.shape[1] + comp_B_C.shape[1]  # picks the attention kernel
    pos_P_L = (mask_P_L.cumsum(-1) - 1).clamp(min=0)
    cache = DynamicCache()
    with contiguous_head_input(model), short_rows_attention(model, row_tokens):
        first_P_V = model(
            input_ids=ids_P_L, attention_mask=mask_P_L, position_ids=pos_P_L,
            cache=cache, use_cache=True, logits_to_keep=1,
        ).logits[:, -1]
    ns = torch.tensor([len(c) for c in completions], device=device)
    logits_B_1_V = first_P_V.repeat_interleave(ns, dim=0)[:, None]
    if comp_B_C.shape[1] > 1:
        repeat_cache_rows(cache, ns)
        mask_B_L = mask_P_L.repeat_interleave(ns, dim=0)
        start_B_1 = pos_P_L[:, -1:].repeat_interleave(ns, dim=0) + 1
        steps = torch.arange(comp_B_C.shape[1] - 1, device=device)[None]
        with short_rows_attention(model, row_tokens):
            rest_B_Cm1_V = model(
                input_ids=comp_B_C[:, :-1],
                attention_mask=torch.cat([mask_B_L, cmask_B_C[:, :-1]], dim=1),
                position_ids=start_B_1 + steps,
                cache=cache, use_cache=True,
            ).logits
        logits_B_C_V = torch.cat([logits_B_1_V, rest_B_Cm1_V], dim=1)
    else:
        logits_B_C_V = logits_B_1_V
    if logits_B_C_V.dtype in (torch.bfloat16, torch.float16):
        logits_B_C_V = logits_B_C_V.float()
    logits_B_C_V = scaled(logits_B_C_V, temperature)  # T = 1: no division, same bits
    logsm_B_C_V = logits_B_C_V.log_softmax(-1)
    logp_B_C = logsm_B_C_V.gather(-1, comp_B_C[..., None])[..., 0]
    with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
        entropy_B_C = -(logsm_B_C_V.exp() * logsm_B_C_V).sum(-1)
    mask = cmask_B_C.to(logp_B_C.dtype)
    if loss_masks is not None:
        flat_masks = [m for group in loss_masks for m in group]
        if [len(m) for m in flat_masks] != [len(c) for c in flat]:
            raise ValueError("completion_logprobs: each loss mask must match its completion")
        mask = mask * right_pad(flat_masks, 0, device)[0].to(logp_B_C.dtype)
    return TokenLogprobs(logp_B_C * mask, mask, entropy_B_C * mask)
