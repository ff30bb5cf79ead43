"""The SFT warm start as a phase of the run, before its RL steps (the step itself, on a model
and rows, is trainer/sft.py's).

`sft.steps` optimizer steps (or `sft.epochs` passes) of `sft.batch_size` conversations, in a
seeded order, with the trainer's model and AdamW (lr `sft.lr` for the phase; its moments carry
over into RL), logged as `{"phase": "sft", "sft_step": k, ...}` records. Its checkpoints are
step-0 checkpoints holding `phase: "sft"`, so `--resume` continues the phase. At its end the
weight sync restarts at version 0, so the engine serves the SFT weights before the first RL
step, and the held-out set is evaluated (`eval_after_sft.json`) when the run has one.
Not covered: SFT in async mode or with data-parallel ranks.
"""

from __future__ import annotations

import json
import math
import time

from traingym.core.precision import engine_dtype
from traingym.trainer.sft import assistant_mask, batch_rows, load_chats, sft_step


def total_steps(cfg, n_rows: int) -> int:
    s = cfg.sft
    return s.steps or max(1, math.ceil(s.epochs * n_rows / s.batch_size))


def sft_phase(run) -> dict | None:
    """Run (or finish, on resume) the SFT phase; returns its last record (None: skipped)."""
    from traingym.runs import checkpoint  # heavy: safetensors

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
            loss, n_tok, grad_norm = sft_step(trainer, rows, run.tokenizer.pad_token_id)
            record = {"phase": "sft", "step": 0, "sft_step": k + 1, "sft_steps": total,
                      "loss": loss, "trained_tokens": n_tok,
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
    from traingym.weights.colocated import ColocatedSync  # heavy: numpy, pydantic, zstandard

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
