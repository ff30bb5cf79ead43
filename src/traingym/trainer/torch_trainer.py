"""Single-process torch trainer: one clipped AdamW step per batch, over micro-batches of groups
(or, with `trainer.optimizer_in_backward`, unclipped steps inside one backward pass over the
batch: trainer/optimizers.py).

On-policy: the PPO ratio's "old" log-probs are the trainer's own, detached (ratio 1 in value).
The engine's log-probs differ (an older policy in async mode, other numerics in any mode):
`importance` (algorithms/importance.py) weights each policy token by the truncated or masked
ratio, and every step reports the gap (`mismatch_abs_logp`, `mismatch_kl_k3`: KL(engine ||
trainer) estimated from this step's forward pass, before its update).
The algorithm (algorithms/base.py) supplies the per-token loss, token weights, loss divisor and
per-token advantages; it may add a KL reference (`kl_coef > 0`, log-probs once per batch), a
value head (`needs_values`, trainer/value_head.py: checkpointed, never exported) or a teacher
(`needs_teacher`, trainer/teacher.py). Environment tokens (`loss_mask` 0) are context only.
A batch whose groups were all dropped makes no update but counts as a step (mismatch null).
Mixture-of-experts policies: the policy forward replays the engine's routes with
`algorithm.routing_replay`, and steps report `moe_route_mismatch` (trainer/replay.py); with
`algorithm.moe_aux_loss_coef > 0` the loss adds the family's load-balancing loss, reported as
`moe_aux_loss` (trainer/moe_aux.py).
"""

from __future__ import annotations

import contextlib
import copy
import math

import torch

from traingym.algorithms.grpo import GRPO
from traingym.algorithms.importance import (
    ImportanceSpec,
    importance_sums,
    importance_weights,
    mismatch_sums,
    over_cap,
)
from traingym.core import memory, trace
from traingym.core.precision import autocast_bf16
from traingym.core.types import Batch
from traingym.trainer.casts import Borrowing, lending, own_casts
from traingym.trainer.config import TrainerConfig
from traingym.trainer.logprobs import completion_logprobs
from traingym.trainer.micro import micro_batches, sequence_logprobs
from traingym.trainer.moe_aux import AuxLoss
from traingym.trainer.optimizers import StepInBackward, make_optimizer
from traingym.trainer.replay import RouteReplay, route_fractions
from traingym.trainer.step_changes import ChangeTracking, trackable
from traingym.trainer.value_head import make_value_head, value_targets, values_of


class TorchTrainer:
    def __init__(self, model, cfg: TrainerConfig, temperature: float, pad_token_id: int,
                 importance=None, wrap=None, algorithm=None, teacher=None):
        """`wrap` (trainer/rank.py: DDP or FSDP2) is applied after the KL reference is copied
        and before the optimizer is built; forward passes go through what it returns.
        `algorithm`: an algorithms/base.py Algorithm (None: GRPO with its defaults).
        `teacher`: a trainer/teacher.py teacher, for an algorithm with `needs_teacher`."""
        if algorithm is None:
            algorithm = GRPO()
        if algorithm.needs_teacher and teacher is None:
            raise ValueError(f"algorithm {type(algorithm).__name__} needs a teacher "
                             "(distill.teacher) and none was given")
        self.algorithm = algorithm
        self.teacher = teacher
        self.model = model.train()
        self.cfg = cfg
        self.temperature = temperature
        self.pad_token_id = pad_token_id
        self.importance: ImportanceSpec | None = importance  # None: no correction
        self.reference = None
        if algorithm.needs_reference:
            self.reference = copy.deepcopy(model).eval().requires_grad_(False)
        self.logprobs = completion_logprobs  # the shared-prompt path (trainer/logprobs.py)
        if cfg.gradient_checkpointing:  # HF drops the KV cache then: full rows (micro.py)
            enable = (getattr(model, "activation_checkpointing_enable", None)  # transformers 5.2x
                      or model.gradient_checkpointing_enable)
            enable({"use_reentrant": False})
            self.logprobs = sequence_logprobs
        self.routes = RouteReplay(model, algorithm.knobs.routing_replay,
                                  cfg.gradient_checkpointing)  # MoE: trainer/replay.py
        self.aux = AuxLoss(model, algorithm.knobs.moe_aux_loss_coef)  # trainer/moe_aux.py
        self.forward_model = wrap(model) if wrap is not None else model
        self._loan = None  # lend(): bf16 casts for the next step only (trainer/casts.py)
        self._lendable: dict[str, str] | None = None  # use -> tensor name (casts.lending)
        self.value_head = None  # algorithms with needs_values (trainer/value_head.py)
        if algorithm.needs_values:
            self.value_head = make_value_head(model)
        # trained beside the model, saved in checkpoints (runs/checkpoint.py), never exported
        self.extra_modules = ({"value_head": self.value_head} if self.value_head is not None
                              else {})
        self.optimizer = make_optimizer(model, cfg, self.value_head,
                                        algorithm.options.value_lr_scale
                                        if self.value_head is not None else 1.0)
        self.in_backward = StepInBackward(self.optimizer) if cfg.optimizer_in_backward else None
        self._tracking: ChangeTracking | None = None  # track_changes()

    def _autocast(self):
        device = next(self.model.parameters()).device.type
        if not autocast_bf16(self.cfg.bf16_autocast, device):
            return contextlib.nullcontext()
        return torch.autocast(device_type=device, dtype=torch.bfloat16)

    def train_step(self, batch: Batch) -> dict[str, float]:
        total_tokens = batch_tokens(batch)
        if total_tokens == 0:
            return empty_metrics(self.cfg.lr)
        self.optimizer.zero_grad(set_to_none=True)
        stats = self.accumulate(batch.groups, batch.advantages_G, total_tokens,
                                denom=self.algorithm.denominator(batch))
        self._loan = None  # the step writes the weights: the casts are stale from here
        grad_norm = check_finite(self.clip_and_step())
        self.optimizer.zero_grad(set_to_none=True)  # no gradients held through the publish
        if self.cfg.trim_memory:
            memory.trim()
        return route_fractions({**stats, "grad_norm": grad_norm,
                                "trained_tokens": total_tokens, "lr": self.cfg.lr})

    def accumulate(self, groups, advantages_G, total_tokens: int, scale: float = 1.0,
                   denom: float | None = None) -> dict:
        """Forward and backward over `groups` in micro-batches, gradients accumulated; the loss
        (the algorithm's per-token loss times its token weights) is summed and divided by
        `denom` (the whole batch's, which may hold more groups than these; None:
        `total_tokens`), times `scale`. Stats are per policy token of the batch: divided by
        `total_tokens`. Returns the stats' shares."""
        denom = float(total_tokens) if denom is None else denom
        algo, knobs = self.algorithm, self.algorithm.knobs
        stats = {"loss": 0.0, "kl": 0.0, "entropy": 0.0, "clip_frac": 0.0,
                 "mismatch_abs_logp": 0.0, "mismatch_kl_k3": 0.0}
        chunks = self._chunks(groups, advantages_G)
        rows = [self._rows(chunk) for chunk, _ in chunks]
        refs = [None] * len(rows)
        if self.reference is not None:  # once per batch, before its micro-batches
            with trace.span("reference_logprobs", cat="trainer"):
                refs = [self._no_grad_logp(self.reference, r) for r in rows]
        teacher = None
        if algo.needs_teacher:  # once per batch, before its micro-batches
            teacher = self.teacher.logprobs(self, groups, chunks, rows)
        targets, token_adv, extra = None, None, {}
        if self.value_head is not None:  # V_old, GAE: once per batch, before the update
            with trace.span("values", cat="trainer"):
                targets = value_targets(self, chunks, rows, refs)
            token_adv, extra = targets.advantages, {"hidden": True}
            stats.update({**targets.stats, "value_loss": 0.0, "value_clip_frac": 0.0})
        elif algo.token_level:
            token_adv = self._token_advantages(chunks, rows, refs)
        if knobs.entropy_coef > 0:
            extra["entropy_grad"] = True
        if knobs.moe_aux_loss_coef > 0:
            stats["moe_aux_loss"] = 0.0
        with self._borrowing():  # through each backward: a checkpoint recomputes the forward
            for n, (chunk, advantages) in enumerate(chunks):
                with self._autocast(), trace.span("forward", cat="trainer", micro=n), \
                        self.routes.forward(chunk, stats), self.aux.collect() as router_logits:
                    out = self.logprobs(self.forward_model, *rows[n], **extra)
                mask = out.mask_B_T  # policy tokens only
                aux = None
                if router_logits:  # algorithm.moe_aux_loss_coef > 0 (trainer/moe_aux.py)
                    aux = self.aux.loss(router_logits, rows[n][0], rows[n][1], rows[n][4])
                    router_logits.clear()
                adv_B = torch.tensor([a for adv in advantages for a in adv], dtype=torch.float32,
                                     device=out.logp_B_T.device)
                adv_B_T = token_adv[n] if token_adv is not None else adv_B[:, None]
                trainer_B_T = out.logp_B_T.detach().float()
                if teacher is not None:
                    adv_B_T = algo.teacher_advantages(trainer_B_T, teacher[n], adv_B, mask)
                engine_B_T = engine_logprobs(chunk, trainer_B_T)
                sums = mismatch_sums(trainer_B_T, engine_B_T, mask)
                weight_B_T = self._importance(trainer_B_T, engine_B_T, mask, sums)
                loss_B_T, clipped_B_T = algo.token_loss(out.logp_B_T, out.logp_B_T.detach(),
                                                        adv_B_T, mask)
                if weight_B_T is not None:
                    loss_B_T = loss_B_T * weight_B_T.detach()
                kl_B_T = torch.zeros_like(loss_B_T)
                if refs[n] is not None:
                    kl_B_T = algo.kl(out.logp_B_T, refs[n])
                    if knobs.kl_in == "loss":
                        loss_B_T = loss_B_T + knobs.kl_coef * kl_B_T
                if teacher is not None:  # reported only: k1 of KL(trainer || teacher)
                    kl_B_T = trainer_B_T - teacher[n]
                if knobs.entropy_coef > 0:
                    loss_B_T = loss_B_T - knobs.entropy_coef * out.entropy_B_T
                if targets is not None:
                    value_B_T = self._value_loss(out, targets, n, stats, total_tokens)
                    loss_B_T = loss_B_T + algo.options.vf_coef * value_B_T
                for k, v in sums.items():
                    stats[k] = stats.get(k, 0.0) + v / total_tokens
                weighted = loss_B_T * algo.token_weights(mask)
                total = weighted.sum().mul(scale).div(denom)
                if aux is not None:  # its share of the batch: this micro-batch's policy tokens
                    share = float(mask.sum()) / total_tokens
                    total = total + aux * (knobs.moe_aux_loss_coef * share * scale)
                    stats["moe_aux_loss"] += float(aux.detach()) * share
                if self.cfg.trim_memory:  # what the forward freed, before the backward's peak
                    memory.trim()
                with trace.span("backward", cat="trainer", micro=n):
                    total.backward()
                if self.cfg.trim_memory:  # the pass's freed activations back to the system
                    memory.trim()
                stats["loss"] += float(weighted.detach().sum()) / denom
                stats["kl"] += float((kl_B_T.detach() * mask).sum()) / total_tokens
                stats["entropy"] += float((out.entropy_B_T.detach() * mask).sum()) / total_tokens
                stats["clip_frac"] += float((clipped_B_T * mask).sum()) / total_tokens
        return stats

    def lend(self, lender) -> None:
        """For the next `train_step` only: `lender(names)` gives bf16 tensors equal to those
        weights' casts now, or None (weights/colocated.py lent_casts), which a bf16 autocast
        forward then reads instead of casting (trainer/casts.py). Call it only while they are
        the casts: right after publishing the weights, before anything changes them. Ignored
        where the forward is wrapped (DDP/FSDP). Gradient checkpointing's recompute reads
        them too (the step's passes run inside `_borrowing`)."""
        if self.forward_model is self.model:
            self._loan = lender

    def _borrowing(self):
        """What a step's forward and backward passes run under. Under bf16 autocast the model
        reads bf16 casts of its linear weights (trainer/casts.py Borrowing): those lent for
        this step (the colocated engine's own tensors, no copy), else casts made here. Not made
        here under gradient checkpointing: they would live through the backward, where
        autocast's own go with its cache at the end of each forward."""
        if self.forward_model is not self.model or not autocast_bf16(
                self.cfg.bf16_autocast, next(self.model.parameters()).device.type):
            return contextlib.nullcontext()
        if self._lendable is None:
            self._lendable = lending(self.forward_model)
        sources = set(self._lendable.values())
        casts = self._loan(sources) if self._loan is not None and sources else None
        if casts is None and sources and not self.cfg.gradient_checkpointing:
            casts = own_casts(self.model, sources)
        if not casts:
            return contextlib.nullcontext()
        uses = {use: casts[src] for use, src in self._lendable.items()}
        return Borrowing(self.forward_model, uses, accumulate=self.in_backward is None)

    def _value_loss(self, out, targets, n: int, stats: dict, total_tokens: int):
        """Per-token value loss of micro-batch n (the algorithm's, e.g. clipped); its stats."""

        mask = out.mask_B_T
        v_B_T = values_of(self.value_head, out.hidden_B_T_H, mask)
        loss_B_T, clipped_B_T = self.algorithm.value_loss(v_B_T, targets.old_values[n],
                                                          targets.returns[n])
        stats["value_loss"] += float((loss_B_T.detach() * mask).sum()) / total_tokens
        stats["value_clip_frac"] += float((clipped_B_T * mask).sum()) / total_tokens
        return loss_B_T

    def _chunks(self, groups, advantages_G) -> list[tuple[list, list]]:
        """The micro-batches (forward/backward passes) over (groups, advantages); one pass over
        the batch when the optimizer steps in the backward pass."""
        if self.in_backward is not None:
            return [(groups, advantages_G)]
        return micro_batches(groups, advantages_G, self.cfg.micro_batch_groups,
                             self.cfg.micro_batch_tokens)

    def _rows(self, chunk) -> tuple:
        return ([g.samples[0].prompt_ids for g in chunk],
                [[s.completion_ids for s in g.samples] for g in chunk],
                self.temperature, self.pad_token_id,
                [[s.loss_mask for s in g.samples] for g in chunk])

    def _no_grad_logp(self, model, rows) -> torch.Tensor:
        with torch.no_grad(), self._autocast():
            return self.logprobs(model, *rows).logp_B_T.float()

    def _token_advantages(self, chunks, rows, refs) -> list[torch.Tensor]:
        """Per-token advantages (KL as a reward penalty): one no-grad pass of the policy over
        the batch for its log-probs, the KL to the reference, then the algorithm's shaping."""
        parts = []
        for (chunk, advantages), r, ref in zip(chunks, rows, refs):
            with self.routes.forward(chunk, {}):  # MoE: the policy's routes replayed
                logp = self._no_grad_logp(self.forward_model, r)
            mask = completion_mask(chunk, logp)
            adv_B = torch.tensor([a for adv in advantages for a in adv], dtype=torch.float32)
            parts.append((adv_B.to(logp.device), self.algorithm.kl(logp, ref) * mask, mask))
        return [a.float() for a in self.algorithm.token_advantages(parts)]

    def clip_and_step(self) -> float:
        """Clip the gradients' global norm (unless `grad_clip` is 0) and step, unless that norm
        is not finite (then no update); returns the norm before clipping. In-backward: the
        backward pass has stepped already; returns its norm, and raises FloatingPointError when
        that is not finite (the parameters took the step: resume from a checkpoint)."""
        with trace.span("optimizer", cat="trainer"):
            if self.in_backward is not None:
                grad_norm = self.in_backward.finish()
                if not math.isfinite(grad_norm):
                    raise FloatingPointError(
                        f"gradient norm is {grad_norm} and trainer.optimizer_in_backward has "
                        "already stepped the parameters with it: resume the run from its last "
                        "checkpoint with a lower trainer.lr or trainer.bf16_autocast off")
                return grad_norm
            params = [*self.model.parameters(),
                      *(self.value_head.parameters() if self.value_head is not None else ())]
            if self.cfg.grad_clip > 0:
                grad_norm = float(torch.nn.utils.clip_grad_norm_(params, self.cfg.grad_clip))
            else:
                grad_norm = float(torch.nn.utils.get_total_norm(
                    [p.grad for p in params if p.grad is not None]))
            if math.isfinite(grad_norm):
                (self._tracking.step if self._tracking is not None else self.optimizer.step)()
        return grad_norm

    def track_changes(self, dtype: torch.dtype, version: int) -> None:
        """The weights now are what `version` published as `dtype`: from here the optimizer
        step records which of those values it changes, for `take_changes()` at the next
        publish (trainer/step_changes.py). Ignored (take_changes: None) unless `dtype` is
        narrower than the weights and the optimizer steps after the backward pass as torch's
        fused AdamW on one process's own tensors, exported as they are (not LoRA's merge)."""
        if self._tracking is None:
            params = list(self.model.parameters())
            if (not self.cfg.emit_changes or type(self).export is not TorchTrainer.export
                    or self.in_backward is not None
                    or self.forward_model is not self.model
                    or not trackable(self.optimizer)
                    or any(torch.empty(0, dtype=dtype).element_size() >= p.element_size()
                           for p in params)):
                return
            names: dict = {}
            for name, p in self.model.named_parameters(remove_duplicate=False):
                names.setdefault(p, []).append(name)
            self._tracking = ChangeTracking(self.optimizer, names, dtype)
        if self._tracking.dtype == dtype:
            self._tracking.arm(version)

    def take_changes(self):
        """The values changed since `track_changes` (weights/base.py Changed), or None."""
        return self._tracking.take() if self._tracking is not None else None

    def _importance(self, trainer_B_T, engine_B_T, mask_B_T, sums: dict) -> torch.Tensor | None:
        """Importance weights (None: no correction); adds their sums to `sums`."""
        imp = self.importance
        if imp is None or imp.mode == "none":
            return None
        w_B_T = importance_weights(trainer_B_T, engine_B_T, mask_B_T, imp.mode, imp.level,
                                   imp.cap)
        capped = over_cap(trainer_B_T, engine_B_T, mask_B_T, imp.level, imp.cap)
        sums.update(importance_sums(w_B_T, mask_B_T, capped))
        return w_B_T

    def export(self) -> dict[str, torch.Tensor]:
        return {k: v.detach() for k, v in self.model.state_dict().items()}

    def close(self) -> None:
        """Closes the teacher, if any (an engine may own a process), and removes the
        in-backward hooks; idempotent."""
        if self.teacher is not None:
            self.teacher.close()
        if self.in_backward is not None:
            self.in_backward.remove()


def engine_logprobs(groups, like_B_T: torch.Tensor) -> torch.Tensor:
    """The log-probs the engine recorded, rows as completion_logprobs lays them out (B, T),
    float32, 0 past each completion (environment tokens carry 0.0 already)."""
    engine_B_T = torch.zeros_like(like_B_T, dtype=torch.float32)
    for i, lps in enumerate(s.completion_logprobs for g in groups for s in g.samples):
        engine_B_T[i, : len(lps)] = torch.tensor(lps, dtype=torch.float32)
    return engine_B_T


def completion_mask(groups, like_B_T: torch.Tensor) -> torch.Tensor:
    """Policy-token mask (B, T) laid out as completion_logprobs lays out rows."""
    mask_B_T = torch.zeros_like(like_B_T)
    for i, m in enumerate(s.loss_mask for g in groups for s in g.samples):
        mask_B_T[i, : len(m)] = torch.tensor(m, dtype=mask_B_T.dtype)
    return mask_B_T


def batch_tokens(batch: Batch) -> int:
    """Policy tokens in the batch: what the token-level loss is divided by."""
    return sum(sum(s.loss_mask) for g in batch.groups for s in g.samples)


def empty_metrics(lr: float) -> dict[str, float | None]:
    """A step with nothing to learn from (every group dropped): no update; the mismatch is
    not measured (None: null in events.jsonl)."""
    return {"loss": 0.0, "kl": 0.0, "entropy": 0.0, "clip_frac": 0.0, "grad_norm": 0.0,
            "trained_tokens": 0, "lr": lr, "mismatch_abs_logp": None, "mismatch_kl_k3": None}


def check_finite(grad_norm: float) -> float:
    if not math.isfinite(grad_norm):
        raise FloatingPointError(f"gradient norm is {grad_norm}; lower trainer.lr or "
                                 "turn off trainer.bf16_autocast")
    return grad_norm
