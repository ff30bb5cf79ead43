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
from traingym.models.scoring import contiguous_head_input, short_rows_attention

ROWS_PER_CHUNK = 64  # vocabulary rows of fp32 work at a time: 64 x 49152 x 4 B = 12 MiB


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
    logp_B_C, entropy_B_C = token_logprobs_and_entropy(logits_B_C_V, comp_B_C, temperature)
    if not (entropy_grad and torch.is_grad_enabled()):
        entropy_B_C = entropy_B_C.detach()
    mask = cmask_B_C.to(logp_B_C.dtype)
    if loss_masks is not None:
        flat_masks = [m for group in loss_masks for m in group]
        if [len(m) for m in flat_masks] != [len(c) for c in flat]:
            raise ValueError("completion_logprobs: each loss mask must match its completion")
        mask = mask * right_pad(flat_masks, 0, device)[0].to(logp_B_C.dtype)
    return TokenLogprobs(logp_B_C * mask, mask, entropy_B_C * mask)


def token_logprobs_and_entropy(logits_B_C_V: torch.Tensor, ids_B_C: torch.Tensor,
                               temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    """log softmax(z)[ids] and the entropy of softmax(z), z = logits / T (T <= 0 or 1: the
    logits), both (B, C) in fp32 (fp64 for fp64 logits) and differentiable, with no
    full-vocabulary tensor beyond the logits themselves: ROWS_PER_CHUNK rows at a time, forward
    and backward (which recomputes softmax from the logits and the saved log-sum-exp). The
    same sums as log_softmax, gather and -(p * log p).sum() up to float rounding
    (tests/unit/test_logprobs.py)."""
    t = temperature if temperature > 0 else 1.0
    B, C, V = logits_B_C_V.shape
    logp, entropy = _VocabTerms.apply(logits_B_C_V.reshape(B * C, V), ids_B_C.reshape(-1), t)
    return logp.view(B, C), entropy.view(B, C)


class _VocabTerms(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits_N_V, ids_N, t):
        n = logits_N_V.shape[0]
        work = torch.promote_types(logits_N_V.dtype, torch.float32)  # fp64 stays fp64
        lse_N = logits_N_V.new_empty(n, dtype=work)
        logp_N, ent_N = torch.empty_like(lse_N), torch.empty_like(lse_N)
        for lo in range(0, n, ROWS_PER_CHUNK):
            hi = min(lo + ROWS_PER_CHUNK, n)
            z = logits_N_V[lo:hi].to(lse_N.dtype)
            if t != 1.0:
                z = z / t
            lse = z.logsumexp(-1)
            lse_N[lo:hi] = lse
            logp_V = z - lse[:, None]  # not in place: z may be the logits themselves
            logp_N[lo:hi] = logp_V.gather(-1, ids_N[lo:hi, None])[:, 0]
            ent_N[lo:hi] = -(logp_V.exp() * logp_V).sum(-1)
        ctx.save_for_backward(logits_N_V, ids_N, lse_N, ent_N)
        ctx.t = t
        ctx.set_materialize_grads(False)  # an output nothing depends on: None, not zeros
        return logp_N, ent_N

    @staticmethod
    def backward(ctx, g_logp_N, g_ent_N):
        """d logp_j / dz = onehot_j - p; d H / dz = -p (log p + H); then / T."""
        if g_logp_N is None and g_ent_N is None:
            return None, None, None
        logits_N_V, ids_N, lse_N, ent_N = ctx.saved_tensors
        t = ctx.t
        grad = torch.empty_like(logits_N_V)
        for lo in range(0, logits_N_V.shape[0], ROWS_PER_CHUNK):
            hi = min(lo + ROWS_PER_CHUNK, logits_N_V.shape[0])
            z = logits_N_V[lo:hi].to(lse_N.dtype)
            if t != 1.0:
                z = z / t
            logp_V = z - lse_N[lo:hi, None]
            p = logp_V.exp()
            dz = None
            if g_ent_N is not None:  # before p is overwritten below
                dz = logp_V.add_(ent_N[lo:hi, None]).mul_(p).mul_(g_ent_N[lo:hi, None]).neg_()
            if g_logp_N is not None:
                g = g_logp_N[lo:hi, None]
                dz = p.mul_(g).neg_() if dz is None else dz.sub_(p.mul_(g))
                dz.scatter_add_(-1, ids_N[lo:hi, None], g)
            if t != 1.0:
                dz = dz / t
            grad[lo:hi] = dz
        return grad, None, None
