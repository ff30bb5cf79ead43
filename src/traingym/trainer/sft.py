"""Supervised fine-tuning on chat data, the trainer's side: rows and their assistant masks,
the loss, one step (`sft_step`). The phase around it is loop/sft.py's.

Data (`sft.data`): a JSONL file of {"messages": [...]} rows or a local `datasets` folder. Each
conversation is rendered with the tokenizer's chat template; the loss (token-level mean of
-log p) covers the assistant turns only, spans found by rendering messages[:i] with the
generation prompt and messages[:i + 1], so the assistant header is context and the end-of-turn
token a target. A template whose renderings are not prefixes of each other is refused.
Not covered: packing several conversations per row, multi-modal messages.
"""

from __future__ import annotations

import random

from traingym.core.padding import right_pad
from traingym.envs.datasets import DatasetError, load_rows


def load_chats(source) -> list[list[dict]]:
    rows = load_rows(source)
    chats = []
    for n, row in enumerate(rows, 1):
        msgs = row.get("messages") if isinstance(row, dict) else None
        if not isinstance(msgs, list) or not all(isinstance(m, dict) and "role" in m
                                                  and "content" in m for m in msgs):
            raise DatasetError(f"sft.data {source}: row {n} needs 'messages', a list of "
                               "{'role', 'content'} dicts")
        if not any(m["role"] == "assistant" for m in msgs):
            raise DatasetError(f"sft.data {source}: row {n} has no assistant message to learn")
        chats.append(msgs)
    if not chats:
        raise DatasetError(f"sft.data {source}: no rows")
    return chats


def assistant_mask(tok, messages: list[dict]) -> tuple[list[int], list[int]]:
    """(token ids of the rendered conversation, 1 on assistant-turn tokens else 0)."""
    def render(msgs, gen=False):
        return tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=gen)

    full = render(messages)
    spans = []
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        start, end = render(messages[:i], gen=True), render(messages[: i + 1])
        if not (end.startswith(start) and full.startswith(end)):
            raise ValueError("the chat template's renderings are not prefixes of each other, "
                             "so assistant turns cannot be located; use a template that renders"
                             " turns in order (or pre-render the data)")
        spans.append((len(start), len(end)))
    enc = tok(full, add_special_tokens=False, return_offsets_mapping=True)
    mask = [int(any(a <= s < b for a, b in spans) and e > s) for s, e in enc["offset_mapping"]]
    return list(enc["input_ids"]), mask


def sft_loss(model, rows: list[tuple[list[int], list[int]]], pad_id: int):
    """(sum of -log p over masked target tokens, their count)."""
    device = next(model.parameters()).device
    ids, attn = right_pad([r[0] for r in rows], pad_id, device)
    target_mask = right_pad([r[1] for r in rows], 0, device)[0]
    logits = model(input_ids=ids, attention_mask=attn, use_cache=False).logits[:, :-1].float()
    logp = logits.log_softmax(-1).gather(-1, ids[:, 1:, None])[..., 0]
    m = target_mask[:, 1:].to(logp.dtype)
    return -(logp * m).sum(), int(m.sum())


def batch_rows(n_rows: int, seed: int, step: int, size: int) -> list[int]:
    """Row indices of SFT step `step`: a fresh seeded permutation per epoch."""
    out = []
    for pos in range(step * size, (step + 1) * size):
        epoch, offset = divmod(pos, n_rows)
        order = list(range(n_rows))
        random.Random(seed * 7_919 + epoch).shuffle(order)
        out.append(order[offset])
    return out


def sft_step(trainer, rows: list[tuple[list[int], list[int]]], pad_id: int):
    """One optimizer step of `trainer` (its model, optimizer, clipping) on `rows`; returns
    (the token-level mean loss, the target tokens, the gradient norm before clipping)."""
    trainer.optimizer.zero_grad(set_to_none=True)
    loss_sum, n_tok = sft_loss(trainer.model, rows, pad_id)
    (loss_sum / max(n_tok, 1)).backward()
    grad_norm = trainer.clip_and_step()
    return float(loss_sum.detach()) / max(n_tok, 1), n_tok, grad_norm
