"""The distillation teacher, the trainer's side: load it, and score the student's samples.

For an algorithm with `needs_teacher` (algorithms/distill.py) it gives, once per batch, the
teacher's log-prob of every sampled token at the rollout temperature, laid out as the trainer's
rows. `distill.teacher` is 'tiny', 'embedded', a local HF folder or a traingym checkpoint (or a
run directory: its newest), loaded over the student's `model.path`; it must share the student's
tokenizer. `LocalTeacher` runs it in this process (frozen, fp32); `EngineTeacher` through an
engine with `abilities.scores_tokens` (`distill.teacher_engine`, rollout/registry.py), which
takes the teacher's weights or, taking none (openai), serves its own at `distill.teacher`.
Not covered: a teacher with another tokenizer, SGLang (no scores_tokens).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import torch

from traingym.core import trace
from traingym.models.loader import load_policy
from traingym.rollout.context import EngineContext
from traingym.trainer.config import DistillConfig, teacher_options


def load_teacher(spec: str, student_path: str, seed: int = 0):
    """The teacher model (eval, frozen, fp32) from `distill.teacher`."""
    from safetensors.torch import load_model

    from traingym.runs import checkpoint  # heavy: safetensors

    folder = Path(spec).expanduser()
    ck = None
    if (folder / "checkpoints").is_dir():  # a run directory: its newest checkpoint
        saved = checkpoint.committed(folder / "checkpoints")
        if not saved:
            raise FileNotFoundError(f"distill.teacher={spec!r}: the run holds no committed "
                                    "checkpoint; train it first")
        ck = saved[-1]
    elif (folder / "model.safetensors").is_file() and (folder / checkpoint.MARKER).is_file():
        ck = folder
    if ck is not None:
        checkpoint.verify(ck)
        teacher, _ = load_policy(student_path, seed=seed)
        missing, unexpected = load_model(teacher, str(ck / "model.safetensors"), strict=False)
        if missing or unexpected:
            raise ValueError(f"distill.teacher={spec!r}: {ck} does not hold a full "
                             f"{student_path!r} model (missing {missing[:3]}, unexpected "
                             f"{unexpected[:3]}); a LoRA run's checkpoint cannot be a teacher yet")
    else:
        teacher, _ = load_policy(spec, seed=seed)
    return teacher.eval().requires_grad_(False)


def check_vocab(teacher, student_vocab: int) -> None:
    if teacher.config.vocab_size != student_vocab:
        raise ValueError(f"distill.teacher has a vocabulary of {teacher.config.vocab_size}"
                         f" tokens, the student {student_vocab}: the teacher must share the "
                         "student's tokenizer")


def build_teacher(section: DistillConfig, student_path: str, student_vocab: int, seed: int = 0,
                  engine_dtype: str = "auto", max_batch_rows: int = 64):
    """The teacher `section` (the distill section) names: a LocalTeacher, or an EngineTeacher
    with `teacher_engine`."""
    if section.teacher_engine is None:
        return LocalTeacher(load_teacher(section.teacher, student_path, seed), student_vocab)
    from traingym.rollout import registry  # heavy: safetensors

    name = section.teacher_engine
    raw = teacher_options(name, section.teacher, section.teacher_engine_options)
    ctx = EngineContext(engine=name, options=raw, model=student_path, dtype=engine_dtype,
                        max_batch_rows=max_batch_rows, seed=seed)
    model = tok = None  # an engine without weights: registry.build loads the tokenizer only
    if registry.get(name).abilities.takes_weights:
        from traingym.models.spec import tokenizer  # heavy: safetensors

        model, tok = load_teacher(section.teacher, student_path, seed), tokenizer(student_path)
        check_vocab(model, student_vocab)
    engine, _ = registry.build(ctx, model=model, tokenizer=tok)
    return EngineTeacher(engine)


class LocalTeacher:
    """A second model in the trainer's process."""

    def __init__(self, model, student_vocab: int):
        check_vocab(model, student_vocab)
        self.model = model

    def logprobs(self, trainer, groups, chunks, rows) -> list[torch.Tensor]:
        """Per micro-batch (B, T), no grad, under the trainer's precision."""
        return [trainer._no_grad_logp(self.model, r) for r in rows]

    def close(self) -> None:
        return None


class EngineTeacher:
    """An engine with abilities.scores_tokens."""

    def __init__(self, engine):
        self.engine = engine

    def logprobs(self, trainer, groups, chunks, rows) -> list[torch.Tensor]:
        """One `score` call over the batch's samples (`groups`, in their order), laid out per
        micro-batch (B, T), float32, 0 off the policy tokens (micro-batches may split groups,
        so samples are matched by identity)."""
        samples = [s for g in groups for s in g.samples]
        with trace.span("teacher_score", cat="trainer"):
            got = asyncio.run(self.engine.score([list(s.prompt_ids) for s in samples],
                                                [list(s.completion_ids) for s in samples],
                                                trainer.temperature))
        if [len(x) for x in got] != [len(s.completion_ids) for s in samples]:
            raise RuntimeError(f"distill.teacher_engine returned {[len(x) for x in got]} "
                               "log-probs for completions of "
                               f"{[len(s.completion_ids) for s in samples]} tokens")
        by_sample = {id(s): x for s, x in zip(samples, got)}
        device = next(trainer.model.parameters()).device
        out = []
        for chunk, _ in chunks:
            rows_ = [s for g in chunk for s in g.samples]
            t_B_T = torch.zeros(len(rows_), max(len(s.completion_ids) for s in rows_),
                                dtype=torch.float32, device=device)
            mask_B_T = torch.zeros_like(t_B_T)
            for i, s in enumerate(rows_):
                lps = by_sample[id(s)]
                t_B_T[i, : len(lps)] = torch.tensor(lps, dtype=torch.float32)
                mask_B_T[i, : len(s.loss_mask)] = torch.tensor(s.loss_mask, dtype=torch.float32)
            out.append(t_B_T * mask_B_T)
        return out

    def close(self) -> None:
        """Closes the engine (a vLLM worker, an HTTP client); idempotent."""
        self.engine.close()
