"""PPO with a value head and GAE: per-token advantages from a learned value, as in RLHF PPO.

Papers: Schulman et al. 2017 (arXiv:1707.06347); GAE: Schulman et al. 2016 (arXiv:1506.02438);
InstructGPT (Ouyang et al. 2022). Config: `algorithm.name = "ppo"`; knobs in `Options`, defaults
as TRL's legacy PPOTrainer. GAE runs over each sample's policy tokens (environment turns are
skipped), the reward at the last one; V_old comes from one no-grad pass before the update
(trainer/value_head.py); advantages are whitened over the batch.

Departures: the value is a zero-initialised linear head on the policy's last hidden state (a
shared trunk, as TRL), not a separate critic, trained by the policy's optimizer
(`value_lr_scale`); one optimizer step per batch, so neither clip binds in training; no adaptive
KL controller. Refused: trainer.data_parallel > 1, lora.rank > 0, distill.teacher.
"""

from __future__ import annotations

import torch
from pydantic import Field

from traingym.algorithms.base import Algorithm
from traingym.core.errors import Strict


def gae(rewards_B_T: torch.Tensor, values_B_T: torch.Tensor, mask_B_T: torch.Tensor,
        gamma: float, lam: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(advantages, returns), both (B, T) and 0 off the mask. Each row's masked-in tokens,
    in order, are one episode (tokens with mask 0 between them are skipped, not steps); the
    value after a row's last masked-in token is 0."""
    B, T = mask_B_T.shape
    keep = mask_B_T > 0
    # masked-in positions first, in order: a stable sort of (not kept)
    order_B_T = torch.sort((~keep).to(torch.int8), dim=1, stable=True).indices
    r = rewards_B_T.gather(1, order_B_T)
    v = values_B_T.gather(1, order_B_T)
    m = keep.gather(1, order_B_T).to(v.dtype)
    adv = torch.zeros_like(v)
    next_adv, next_v = v.new_zeros(B), v.new_zeros(B)
    for t in range(T - 1, -1, -1):
        delta = r[:, t] + gamma * next_v - v[:, t]
        adv[:, t] = (delta + gamma * lam * next_adv) * m[:, t]
        next_adv, next_v = adv[:, t], v[:, t] * m[:, t]
    out_adv = torch.zeros_like(adv).scatter(1, order_B_T, adv)
    returns = (out_adv + values_B_T) * keep.to(v.dtype)
    return out_adv, returns


def clipped_value_loss(values_B_T: torch.Tensor, old_values_B_T: torch.Tensor,
                       returns_B_T: torch.Tensor, clip: float
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """(per-token 0.5 max((V - R)^2, (V_clip - R)^2), where the clipped term was the larger),
    V_clip = V_old + clip(V - V_old, -clip, clip); clip 0: 0.5 (V - R)^2, nothing clipped."""
    plain = (values_B_T - returns_B_T) ** 2
    if clip <= 0:
        return 0.5 * plain, torch.zeros_like(plain)
    v_clip = old_values_B_T + (values_B_T - old_values_B_T).clamp(-clip, clip)
    clipped = (v_clip - returns_B_T) ** 2
    return 0.5 * torch.maximum(plain, clipped), (clipped > plain).float()


def explained_variance(values: torch.Tensor, returns: torch.Tensor) -> float | None:
    """1 - Var(R - V) / Var(R) over the given (flat) tokens; None when Var(R) is 0."""
    if returns.numel() < 2 or float(returns.var(unbiased=False)) == 0.0:
        return None
    return float(1 - (returns - values).var(unbiased=False) / returns.var(unbiased=False))


class PPO(Algorithm):
    name = "ppo"
    DEFAULTS = {"clip_low": 0.2, "clip_high": 0.2}

    class Options(Strict):
        gamma: float = Field(1.0, ge=0, le=1, description="GAE discount per policy token")
        lam: float = Field(0.95, ge=0, le=1, description="GAE lambda (1: returns minus values; "
                           "0: one-step TD errors)")
        vf_coef: float = Field(0.1, ge=0, description="weight of the value loss in the loss")
        value_clip: float = Field(0.2, ge=0, description="the value is clipped to old value +- "
                                  "this in the value loss (0: no clip)")
        whiten_advantages: bool = Field(True, description="advantages normalised to mean 0, "
                                        "std 1 over the batch's policy tokens")
        value_lr_scale: float = Field(1.0, gt=0, description="the value head's learning rate is "
                                      "trainer.lr times this")
    drop_equal_groups = False  # the value is the baseline: groups carry no special meaning
    needs_values = True

    @property
    def token_level(self) -> bool:
        return True  # GAE: per-token advantages from the trainer's pass

    def batch_advantages(self, rewards, groups):
        """The shaped rewards themselves: GAE turns them into per-token advantages in the
        trainer's pass (`Batch.advantages_G` holds rewards for PPO)."""
        return rewards

    def value_advantages(self, parts) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """parts: per micro-batch (reward_B, kl_B_T, values_B_T, mask_B_T) -> (advantages_B_T,
        returns_B_T) per micro-batch: GAE over each sample's policy tokens, then (optionally)
        advantages whitened over every policy token of the batch."""
        k, o = self.knobs, self.options
        advs, rets = [], []
        for reward_B, kl_B_T, values_B_T, mask_B_T in parts:
            r_B_T = -k.kl_coef * kl_B_T * mask_B_T
            last = last_index(mask_B_T)
            r_B_T[torch.arange(len(last)), last] += reward_B.to(r_B_T.dtype)
            adv, ret = gae(r_B_T, values_B_T * mask_B_T, mask_B_T, o.gamma, o.lam)
            advs.append(adv)
            rets.append(ret)
        if o.whiten_advantages:
            flat = torch.cat([a[m > 0] for a, (_, _, _, m) in zip(advs, parts)])
            mean, std = flat.mean(), flat.std(unbiased=False)
            advs = [(a - mean) / (std + 1e-8) * (m > 0) for a, (_, _, _, m) in zip(advs, parts)]
        return advs, rets

    def value_loss(self, values_B_T, old_values_B_T, returns_B_T):
        return clipped_value_loss(values_B_T, old_values_B_T, returns_B_T, self.options.value_clip)


def last_index(mask_B_T: torch.Tensor) -> torch.Tensor:
    """Position of each row's last masked-in token (every row needs one)."""
    T = mask_B_T.shape[1]
    pos = torch.arange(T, device=mask_B_T.device).expand_as(mask_B_T)
    last = torch.where(mask_B_T > 0, pos, torch.full_like(pos, -1)).max(dim=1).values
    if bool((last < 0).any()):
        raise ValueError("ppo: a sample without policy tokens has nowhere to put its reward")
    return last
