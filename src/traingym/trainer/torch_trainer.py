"""Single-process torch trainer: GRPO step with micro-batches, grad clipping and AdamW.

One optimizer step per batch, on-policy: the "old" log-probs of the PPO ratio are the trainer's
own log-probs detached, so the ratio is 1 in value and the clip only matters for later epochs or
off-policy data. In disaggregated mode (async_loop.py) the samples come from an older policy:
`importance` (the run's `async` section) then weights each policy token's policy-gradient term
by the importance ratio of the trainer's and the engine's log-probs, truncated or masked
(algorithms/importance.py). The loss is summed over the policy tokens of
the batch and divided by their count (token-level averaging), accumulated over micro-batches of
whole groups so that each prompt is run once per micro-batch. Environment tokens of multi-turn
samples (`Sample.loss_mask` 0) are run through the model as context but carry no loss, no KL
and no entropy, and are not counted.

A batch in which every group was dropped (all rewards equal within each group) has nothing to
learn from: the step makes no optimizer update but still counts as a step, and its
events.jsonl record shows `groups_kept: 0` and `trained_tokens: 0`.
"""

from __future__ import annotations

import contextlib
import copy
import math

import torch

from traingym.algorithms.importance import importance_sums, importance_weights
from traingym.algorithms.losses import grpo_token_loss
from traingym.config import TrainerConfig
from traingym.precision import autocast_bf16
from traingym.trainer.logprobs import completion_logprobs
from traingym.types import Batch


class TorchTrainer:
    def __init__(self, model, cfg: TrainerConfig, temperature: float, pad_token_id: int,
                 importance=None, wrap=None):
        """`wrap` (trainer/rank.py: DDP or FSDP2) is applied after the KL reference is copied
        and before the optimizer is built; forward passes go through what it returns."""
        self.model = model.train()
        self.cfg = cfg
        self.temperature = temperature
        self.pad_token_id = pad_token_id
        self.importance = importance  # AsyncConfig (is_correction, is_level, is_cap) or None
        self.reference = None
        if cfg.kl_coef > 0:
            self.reference = copy.deepcopy(model).eval().requires_grad_(False)
        self.forward_model = wrap(model) if wrap is not None else model
        self.optimizer = make_optimizer(model, cfg)

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
        stats = self.accumulate(batch.groups, batch.advantages_G, total_tokens)
        grad_norm = check_finite(self.clip_and_step())
        return {**stats, "grad_norm": grad_norm, "trained_tokens": total_tokens,
                "lr": self.cfg.lr}

    def accumulate(self, groups, advantages_G, total_tokens: int, scale: float = 1.0) -> dict:
        """Forward and backward over `groups` in micro-batches, gradients accumulated; the loss
        is summed over policy tokens and divided by `total_tokens` (the whole batch's, which
        may hold more groups than these), times `scale`. Returns the stats' shares."""
        stats = {"loss": 0.0, "kl": 0.0, "entropy": 0.0, "clip_frac": 0.0}
        mb = self.cfg.micro_batch_groups
        for start in range(0, len(groups), mb):
            chunk = groups[start : start + mb]
            advantages = advantages_G[start : start + mb]
            rows = ([g.samples[0].prompt_ids for g in chunk],
                    [[s.completion_ids for s in g.samples] for g in chunk],
                    self.temperature, self.pad_token_id,
                    [[s.loss_mask for s in g.samples] for g in chunk])
            with self._autocast():
                out = completion_logprobs(self.forward_model, *rows)
                ref = None
                if self.reference is not None:
                    with torch.no_grad():
                        ref = completion_logprobs(self.reference, *rows).logp_B_T
            adv_B = torch.tensor([a for adv in advantages for a in adv], dtype=torch.float32,
                                 device=out.logp_B_T.device)
            mask = out.mask_B_T  # policy tokens only
            weight_B_T = self._importance(chunk, out.logp_B_T, mask)
            loss_B_T, kl_B_T, clipped_B_T = grpo_token_loss(
                out.logp_B_T, out.logp_B_T.detach(), adv_B, self.cfg.clip_low,
                self.cfg.clip_high, ref, self.cfg.kl_coef, weight_B_T)
            if weight_B_T is not None:
                for k, v in importance_sums(weight_B_T, mask).items():
                    stats[k] = stats.get(k, 0.0) + v / total_tokens
            (loss_B_T * mask).sum().mul(scale).div(total_tokens).backward()
            stats["loss"] += float((loss_B_T.detach() * mask).sum()) / total_tokens
            stats["kl"] += float((kl_B_T.detach() * mask).sum()) / total_tokens
            stats["entropy"] += float((out.entropy_B_T * mask).sum()) / total_tokens
            stats["clip_frac"] += float((clipped_B_T * mask).sum()) / total_tokens
        return stats

    def clip_and_step(self) -> float:
        """Clip the gradients' global norm and step, unless that norm is not finite (then
        no update); returns the norm before clipping."""
        grad_norm = float(torch.nn.utils.clip_grad_norm_(self.model.parameters(),
                                                         self.cfg.grad_clip))
        if math.isfinite(grad_norm):
            self.optimizer.step()
        return grad_norm

    def _importance(self, groups, logp_B_T, mask_B_T) -> torch.Tensor | None:
        """Importance weights from the engine's recorded log-probs (None: no correction)."""
        imp = self.importance
        if imp is None or imp.is_correction == "none":
            return None
        engine_B_T = torch.zeros_like(logp_B_T, dtype=torch.float32)
        rows = [s.completion_logprobs for g in groups for s in g.samples]
        for i, lps in enumerate(rows):
            engine_B_T[i, : len(lps)] = torch.tensor(lps, dtype=torch.float32)
        return importance_weights(logp_B_T.detach().float(), engine_B_T, mask_B_T,
                                  imp.is_correction, imp.is_level, imp.is_cap)

    def export(self) -> dict[str, torch.Tensor]:
        return {k: v.detach() for k, v in self.model.state_dict().items()}

    def close(self) -> None:
        """Nothing to release: one process."""
        return None


def make_optimizer(model, cfg: TrainerConfig) -> torch.optim.Optimizer:
    """AdamW over the trainable parameters, in `model.parameters()` order (a checkpoint's
    optimizer state is keyed by that order)."""
    return torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=cfg.lr,
                             betas=cfg.betas, weight_decay=cfg.weight_decay, foreach=True)


def batch_tokens(batch: Batch) -> int:
    """Policy tokens in the batch: what the token-level loss is divided by."""
    return sum(sum(s.loss_mask) for g in batch.groups for s in g.samples)


def empty_metrics(lr: float) -> dict[str, float]:
    """A step with nothing to learn from (every group dropped): no update."""
    return {"loss": 0.0, "kl": 0.0, "entropy": 0.0, "clip_frac": 0.0, "grad_norm": 0.0,
            "trained_tokens": 0, "lr": lr}


def check_finite(grad_norm: float) -> float:
    if not math.isfinite(grad_norm):
        raise FloatingPointError(f"gradient norm is {grad_norm}; lower trainer.lr or "
                                 "turn off trainer.bf16_autocast")
    return grad_norm
