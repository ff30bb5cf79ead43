"""Micro-batching by tokens, and the full-sequence log-prob path that gradient checkpointing
needs.

`micro_batches` splits a batch's groups into passes of `trainer.micro_batch_groups` whole
groups or, with `trainer.micro_batch_tokens > 0`, packs samples greedily in batch order into
passes within that padded-token cap (a group may be split; a sample above the cap runs alone).
The loss is divided by the whole batch's tokens, so the update is the same either way up to
float rounding. `sequence_logprobs` gives `completion_logprobs`' result from full rows without a
KV cache (models/scoring.py `row_logits`): Hugging Face's gradient checkpointing drops the cache
the shared-prompt path needs, so `trainer.gradient_checkpointing` uses this path, which saves
activation memory at the cost of running each prompt once per sample.
Not covered: checkpointing the shared-prompt path itself.
"""

from __future__ import annotations

import torch

from traingym.core.padding import right_pad
from traingym.core.types import Group
from traingym.models.scoring import row_logits
from traingym.trainer.logprobs import TokenLogprobs, lm_head_inputs, token_logprobs_and_entropy


def pass_tokens(groups: list[Group]) -> int:
    """Padded tokens of one pass: each group's prompt once, plus rows x longest completion."""
    rows = [s for g in groups for s in g.samples]
    if not rows:
        return 0
    return (sum(len(g.samples[0].prompt_ids) for g in groups)
            + len(rows) * max(len(s.completion_ids) for s in rows))


def micro_batches(groups: list[Group], advantages_G: list[list[float]], groups_per_pass: int,
                  max_tokens: int = 0) -> list[tuple[list[Group], list[list[float]]]]:
    """The passes over (groups, advantages): by whole groups (`max_tokens` 0) or by tokens."""
    if max_tokens <= 0:
        return [(groups[i : i + groups_per_pass], advantages_G[i : i + groups_per_pass])
                for i in range(0, len(groups), groups_per_pass)]
    passes: list = []
    parts: list[tuple[Group, list]] = []  # (source group, [(sample, advantage), ...])

    def groups_of(ps):
        return [Group(samples=[x for x, _ in rows], index=src.index) for src, rows in ps]

    def added(ps, group, sample, a):
        if ps and ps[-1][0] is group:
            return [*ps[:-1], (group, [*ps[-1][1], (sample, a)])]
        return [*ps, (group, [(sample, a)])]

    for group, adv in zip(groups, advantages_G):
        for sample, a in zip(group.samples, adv):
            grown = added(parts, group, sample, a)
            if parts and pass_tokens(groups_of(grown)) > max_tokens:
                passes.append(parts)
                grown = added([], group, sample, a)
            parts = grown
    if parts:
        passes.append(parts)
    return [(groups_of(ps), [[a for _, a in rows] for _, rows in ps]) for ps in passes]


def sequence_logprobs(model, prompts, completions, temperature: float, pad_token_id: int,
                      loss_masks=None, entropy_grad: bool = False,
                      hidden: bool = False) -> TokenLogprobs:
    """completion_logprobs' result from full rows (prompt + completion), one pass, no cache."""
    if hidden:
        with lm_head_inputs(model) as seen:
            out = sequence_logprobs(model, prompts, completions, temperature, pad_token_id,
                                    loss_masks, entropy_grad)
        out.hidden_B_T_H = seen[0][:, :-1]
        return out
    device = next(model.parameters()).device
    flat = [c for group in completions for c in group]
    if any(len(c) == 0 for c in flat):
        raise ValueError("sequence_logprobs: every completion needs at least one token")
    row_prompts = [p for p, group in zip(prompts, completions) for _ in group]
    logits, comp_B_C, cmask_B_C = row_logits(model, row_prompts, flat, pad_token_id)
    logp, entropy = token_logprobs_and_entropy(logits, comp_B_C, temperature)
    if not (entropy_grad and torch.is_grad_enabled()):
        entropy = entropy.detach()
    mask = cmask_B_C.to(logp.dtype)
    if loss_masks is not None:
        flat_masks = [m for group in loss_masks for m in group]
        if [len(m) for m in flat_masks] != [len(c) for c in flat]:
            raise ValueError("sequence_logprobs: each loss mask must match its completion")
        mask = mask * right_pad(flat_masks, 0, device)[0].to(logp.dtype)
    return TokenLogprobs(logp * mask, mask, entropy * mask)
