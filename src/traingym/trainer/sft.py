"""Supervised fine-tuning on chat data as a warm start before the RL steps, in the same
trainer, run directory and checkpoint format.

Data: a JSONL file of {"messages": [{"role", "content"}, ...]} rows or a local `datasets`
folder (`sft.data`). Each conversation is rendered with the tokenizer's chat template and the
loss (token-level mean of -log p over the batch) covers the assistant turns only: the mask is
built from the template's own rendering, the span of assistant turn i being the characters
between the rendering of messages[:i] with the generation prompt and the rendering of
messages[:i + 1] (so the assistant header is context and the end-of-turn token, which the
model must learn to emit, is a target). A template whose renderings are not prefixes of each
other is refused with its name.

The phase (`sft_phase`) runs `sft.steps` optimizer steps (or `sft.epochs` passes) of
`sft.batch_size` conversations, in a seeded order, with the trainer's model and optimizer
(AdamW, its learning rate set to `sft.lr` for the phase and restored after; its moment
estimates carry over into RL), logging `{"phase": "sft", "step": 0, "sft_step": k, ...}`
records to events.jsonl. Checkpoints of the phase are ordinary checkpoints at step 0 whose
state holds `phase: "sft"` and `sft_step`, so `--resume` continues the phase where it stopped
and a checkpoint of an RL step (which follows the phase) skips it. At the end of the phase the
weight sync is restarted (a new anchor, version 0) so the engine serves the SFT weights before
the first RL step, and the held-out set is evaluated (`eval_after_sft.json`) when the run has one.
Not covered: packing several conversations per row, SFT in async mode or with data-parallel
ranks, multi-modal messages.
"""

from __future__ import annotations

import json
import math
import random
import time

import torch

from traingym.envs.datasets import DatasetError, load_rows
from traingym.core.padding import right_pad


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


def total_steps(cfg, n_rows: int) -> int:
    s = cfg.sft
    return s.steps or max(1, math.ceil(s.epochs * n_rows / s.batch_size))


def batch_rows(n_rows: int, seed: int, step: int, size: int) -> list[int]:
    """Row indices of SFT step `step`: a fresh seeded permutation per epoch."""
    out = []
    for pos in range(step * size, (step + 1) * size):
        epoch, offset = divmod(pos, n_rows)
        order = list(range(n_rows))
        random.Random(seed * 7_919 + epoch).shuffle(order)
        out.append(order[offset])
    return out


def sft_phase(run) -> dict | None:
    """Run (or finish, on resume) the SFT phase; returns its last record (None: skipped)."""
    from traingym.runs import checkpoint

    cfg, trainer = run.cfg, run.trainer
    if cfg.sft.data is None:
        return None
    chats = load_chats(cfg.sft.data)
    total = total_steps(cfg, len(chats))
    state = run.resumed or {}
    done = state.get("sft_step", 0) if state.get("phase") == "sft" else (total if state else 0)
    if done >= total:
        return None
    _drop_sft_records(run.log.events_path, done)
    encoded = [assistant_mask(run.tokenizer, c) for c in chats]
    groups = trainer.optimizer.param_groups
    record = None
    try:
        for g in groups:
            g["lr"] = cfg.sft.lr
        for k in range(done, total):
            t0 = time.monotonic()
            rows = [encoded[i] for i in batch_rows(len(chats), cfg.seed, k, cfg.sft.batch_size)]
            trainer.optimizer.zero_grad(set_to_none=True)
            loss_sum, n_tok = sft_loss(trainer.model, rows, run.tokenizer.pad_token_id)
            (loss_sum / max(n_tok, 1)).backward()
            grad_norm = trainer.clip_and_step()
            record = {"phase": "sft", "step": 0, "sft_step": k + 1, "sft_steps": total,
                      "loss": float(loss_sum.detach()) / max(n_tok, 1), "trained_tokens": n_tok,
                      "grad_norm": grad_norm, "lr": cfg.sft.lr,
                      "seconds_step": time.monotonic() - t0}
            every = cfg.sft.checkpoint_every
            if k + 1 == total or (every and (k + 1) % every == 0):
                checkpoint.save(run.run_dir / "checkpoints", 0, trainer.model, trainer.optimizer,
                                {"data_position": 0, "phase": "sft", "sft_step": k + 1},
                                keep=cfg.checkpoint.keep,
                                extra=checkpoint.extra_modules(trainer))
            run.log.event(record)
    finally:
        for g in groups:  # not the loaded values: a checkpoint of the phase holds sft.lr
            g["lr"] = cfg.trainer.lr * g.get("lr_scale", 1.0)  # a value head's group: scaled
    _restart_sync(run)
    if run.inputs.eval_rows and cfg.eval.num_prompts > 0:
        scores = run.evaluate()
        (run.run_dir / "eval_after_sft.json").write_text(
            json.dumps({k: vars(v) for k, v in scores.items()}))
        record["eval_after_sft"] = {k: v.mean for k, v in scores.items()}
    return record


def _restart_sync(run) -> None:
    """A new publisher chain (an anchor at version 0) carrying the SFT weights to the engine."""
    from traingym.core.precision import engine_dtype
    from traingym.weights.colocated import ColocatedSync

    run.weights.close()
    run.weights = ColocatedSync(run.engine, run.cfg.weights,
                                engine_dtype(run.cfg.model.engine_dtype), run.run_dir / "weights")
    run.weights.publish(run.trainer.export(), version=0)


def _drop_sft_records(path, done: int) -> None:
    """On resume inside the phase: drop SFT records after the checkpoint (they are redone)."""
    if not path.exists():
        return
    keep = [ln for ln in path.read_text().splitlines() if ln.strip()
            and json.loads(ln).get("sft_step", 0) <= done]
    path.write_text("".join(ln + "\n" for ln in keep))
