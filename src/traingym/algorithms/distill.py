"""On-policy distillation: a teacher scores the student's own samples, token by token.

The student (the policy) samples as in RL; the teacher, a second local model or an engine of
the engine seam, computes the log-prob of every sampled token under softmax(logits / T) at the
rollout temperature T (T = 0: softmax(logits)), as the trainer does for the student. Each
policy token t then gets the advantage

    A_t = coef * (log p_teacher(y_t) - log p_student(y_t)) + reward_coef * A_group,

the negated per-token reverse-KL estimate (k1 of KL(student || teacher) on the student's own
sample), optionally mixed with the task's group-relative advantage (centred rewards of the
group, as GRPO). The loss is the policy gradient -A_t * log p_student(y_t) (A_t held constant),
summed over policy tokens and divided by their count, in micro-batches (trainer/micro.py);
minimising it lowers KL(student || teacher) on the student's distribution (Agarwal et al.
2024, "On-policy distillation of language models"; Lu & Thinking Machines 2025). `kl` in
events.jsonl is the mean of log p_student - log p_teacher over policy tokens.

The teacher (`distill.teacher`): 'tiny', 'embedded' or a local HF folder, or a checkpoint of a
traingym run (a `step_NNNNNN` folder, or a run directory: its newest committed checkpoint),
whose model.safetensors is loaded, verified, over `model.path`. It must share the student's
tokenizer (same vocabulary size, checked).

A teacher behind the engine seam (`distill.teacher_engine`, + `teacher_engine_options`): an
engine with `abilities.scores_tokens` (rollout/base.py `score`): 'torch' (the built-in engine,
in this process), 'vllm' (a vLLM worker process; its log-probs are made exact to the
convention above by dividing the logits by T in the worker) or 'openai' (a server, e.g. vLLM's
OpenAI server; `distill.teacher` is its URL; it scores at T = 1 only, so the config refuses it
with another rollout.temperature). The engine is built on the teacher's weights (loaded as
above, in `model.engine_dtype`) and scores the whole batch in one `score` call before the
micro-batches; it is closed with the trainer. Engines without the ability are refused when the
config is built, naming those that have it.

Every group is trained: with `distill.teacher` set, the run's algorithm (algorithms/
registry.py `build`) keeps groups whose rewards are all equal (`keeping_all_groups`; their
group advantage is 0), since they still carry the teacher's signal. Not covered: LoRA students
with distillation, data-parallel ranks, async mode, SGLang as a teacher engine (it does not
declare scores_tokens), a teacher with another tokenizer.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import torch

from traingym.core import trace
from traingym.trainer.micro import micro_batches
from traingym.trainer.torch_trainer import TorchTrainer, batch_tokens, check_finite


def load_teacher(spec: str, student_path: str, seed: int = 0):
    """The teacher model (eval, frozen, fp32) from `distill.teacher`."""
    from safetensors.torch import load_model

    from traingym.runs import checkpoint
    from traingym.models.loader import load_policy

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


def build_teacher_engine(cfg, student_vocab: int):
    """The teacher behind the engine seam (`distill.teacher_engine`): an engine that takes
    weights gets the teacher's (load_teacher); one that takes none (openai) gets the student's
    tokenizer, and `distill.teacher` as its base_url (trainer/options.py teacher_options)."""
    from traingym.config.schema import Config
    from traingym.eval.specs import _tokenizer
    from traingym.rollout import registry
    from traingym.trainer.config import teacher_options

    d = cfg.distill
    cls = registry.get(d.teacher_engine)
    raw = teacher_options(d.teacher_engine, d.teacher, d.teacher_engine_options)
    engine_cfg = Config(model={"path": cfg.model.path, "engine_dtype": cfg.model.engine_dtype},
                        rollout={"engine": d.teacher_engine, "engine_options": raw,
                                 "max_batch_rows": cfg.rollout.max_batch_rows})
    tok, model = _tokenizer(cfg.model.path), None
    if cls.abilities.takes_weights:
        model = load_teacher(d.teacher, cfg.model.path, cfg.seed)
        check_vocab(model, student_vocab)
    return cls.from_config(engine_cfg, model, tok, registry.options(d.teacher_engine, raw))


def check_vocab(teacher, student_vocab: int) -> None:
    if teacher.config.vocab_size != student_vocab:
        raise ValueError(f"distill.teacher has a vocabulary of {teacher.config.vocab_size}"
                         f" tokens, the student {student_vocab}: the teacher must share the "
                         "student's tokenizer")


class DistillTrainer(TorchTrainer):
    """TorchTrainer whose step is on-policy distillation (optionally mixed with the reward).
    `teacher`: a local model, or an engine with abilities.scores_tokens (build_teacher_engine)."""

    def __init__(self, model, *args, teacher, coef: float, reward_coef: float, **kwargs):
        super().__init__(model, *args, **kwargs)
        self.engine = teacher if not isinstance(teacher, torch.nn.Module) else None
        if self.engine is None:
            check_vocab(teacher, model.config.vocab_size)
        self.teacher, self.coef, self.reward_coef = teacher, coef, reward_coef

    def close(self) -> None:
        """Closes a teacher engine (a vLLM worker, an HTTP client); idempotent."""
        if self.engine is not None:
            self.engine.close()

    def _scores(self, groups) -> dict[int, list[float]]:
        """The teacher engine's log-probs of every sample of the batch, one `score` call,
        keyed by id(sample) (micro-batches may split groups)."""
        samples = [s for g in groups for s in g.samples]
        with trace.span("teacher_score", cat="trainer"):
            got = asyncio.run(self.engine.score([list(s.prompt_ids) for s in samples],
                                                [list(s.completion_ids) for s in samples],
                                                self.temperature))
        if [len(x) for x in got] != [len(s.completion_ids) for s in samples]:
            raise RuntimeError(f"distill.teacher_engine returned {[len(x) for x in got]} "
                               "log-probs for completions of "
                               f"{[len(s.completion_ids) for s in samples]} tokens")
        return {id(s): x for s, x in zip(samples, got)}

    def train_step(self, batch) -> dict:
        total = batch_tokens(batch)
        if total == 0:
            return {"loss": 0.0, "kl": 0.0, "entropy": 0.0, "clip_frac": 0.0, "grad_norm": 0.0,
                    "trained_tokens": 0, "lr": self.cfg.lr, "mismatch_abs_logp": None,
                    "mismatch_kl_k3": None}
        self.optimizer.zero_grad(set_to_none=True)
        scores = self._scores(batch.groups) if self.engine is not None else None
        stats = {"loss": 0.0, "kl": 0.0, "entropy": 0.0, "clip_frac": 0.0,
                 "mismatch_abs_logp": 0.0, "mismatch_kl_k3": 0.0}
        for chunk, advantages in micro_batches(batch.groups, batch.advantages_G,
                                               self.cfg.micro_batch_groups,
                                               self.cfg.micro_batch_tokens):
            rows = ([g.samples[0].prompt_ids for g in chunk],
                    [[s.completion_ids for s in g.samples] for g in chunk],
                    self.temperature, self.pad_token_id,
                    [[s.loss_mask for s in g.samples] for g in chunk])
            with self._autocast():
                out = self.logprobs(self.forward_model, *rows)
                if scores is None:
                    with torch.no_grad():
                        teacher_B_T = self.logprobs(self.teacher, *rows).logp_B_T.float()
            mask, logp = out.mask_B_T, out.logp_B_T
            if scores is not None:
                teacher_B_T = _rows_of(chunk, scores, logp) * mask
            adv_B = torch.tensor([a for adv in advantages for a in adv], dtype=torch.float32)
            adv_B_T = distill_advantages(logp.detach().float(), teacher_B_T, adv_B, mask,
                                         self.coef, self.reward_coef)
            loss_B_T = -adv_B_T * logp
            (loss_B_T * mask).sum().div(total).backward()
            engine_B_T = _engine_logprobs(chunk, logp)
            d = (logp.detach().float() - engine_B_T) * mask
            stats["loss"] += float((loss_B_T.detach() * mask).sum()) / total
            stats["kl"] += float(((logp.detach().float() - teacher_B_T) * mask).sum()) / total
            stats["entropy"] += float((out.entropy_B_T * mask).sum()) / total
            stats["mismatch_abs_logp"] += float(d.abs().sum()) / total
            stats["mismatch_kl_k3"] += float(((torch.expm1(d) - d) * mask).sum()) / total
        grad_norm = check_finite(self.clip_and_step())
        return {**stats, "grad_norm": grad_norm, "trained_tokens": total, "lr": self.cfg.lr}


def keeping_all_groups(cls: type) -> type:
    """`cls` (an algorithms/base.py Algorithm) with `drop_equal_groups = False`."""
    return type(f"{cls.__name__}KeepingAllGroups", (cls,), {"drop_equal_groups": False})


def distill_advantages(student_B_T, teacher_B_T, adv_B, mask_B_T, coef: float,
                       reward_coef: float) -> torch.Tensor:
    """A_t = coef (teacher - student) + reward_coef A_group, 0 off the policy tokens."""
    adv = coef * (teacher_B_T - student_B_T) + reward_coef * adv_B.to(student_B_T)[:, None]
    return adv * mask_B_T


def _rows_of(groups, by_sample: dict[int, list[float]], like_B_T) -> torch.Tensor:
    """Per-sample lists (keyed by id(sample)) as a (B, T) tensor in the trainer's row order."""
    out = torch.zeros_like(like_B_T, dtype=torch.float32)
    for i, s in enumerate(s for g in groups for s in g.samples):
        lps = by_sample[id(s)]
        out[i, : len(lps)] = torch.tensor(lps, dtype=torch.float32)
    return out


def _engine_logprobs(groups, like_B_T) -> torch.Tensor:
    out = torch.zeros_like(like_B_T, dtype=torch.float32)
    for i, lps in enumerate(s.completion_logprobs for g in groups for s in g.samples):
        out[i, : len(lps)] = torch.tensor(lps, dtype=torch.float32)
    return out
