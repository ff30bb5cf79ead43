"""Importance-sampling correction between the engine that sampled and the trainer that learns.

In asynchronous mode a sample comes from an older policy (and, in any mode, from an engine
whose numerics differ from the trainer's: bf16, fused kernels). The policy gradient then needs
the weight w = pi_trainer(token) / pi_engine(token), computed from the trainer's recomputed
log-probs (detached: the weight carries no gradient) and the log-probs the engine recorded.
Large weights explode the variance, so they are bounded (Yao et al. 2025, "Your efficient RL
framework secretly brings you off-policy RL training"; verl's rollout_is options):

- tis (truncated): w -> min(w, cap).
- mis (masked): w -> w if w <= cap else 0 (the token, or the whole sequence, drops out).
- token level: one weight per policy token.
- sequence level: one weight per sample, exp(sum over its policy tokens of the log ratio),
  shared by all of its tokens (computed in log space, so no overflow before the cap).

Not covered: a lower bound for mis (weights near 0 are kept), geometric-mean sequence weights,
weights on the KL term (the weight multiplies the policy-gradient term only).
"""

from __future__ import annotations

import math

import torch


def importance_weights(trainer_logp_B_T: torch.Tensor, engine_logp_B_T: torch.Tensor,
                       mask_B_T: torch.Tensor, mode: str, level: str, cap: float) -> torch.Tensor:
    """Per-token weights (B, T), 0 where `mask_B_T` is 0. mode: none | tis | mis."""
    if mode == "none":
        return mask_B_T.to(trainer_logp_B_T.dtype)
    if mode not in ("tis", "mis") or level not in ("token", "sequence"):
        raise ValueError(f"importance_weights: mode {mode!r} / level {level!r}; expected "
                         "none|tis|mis and token|sequence")
    mask = mask_B_T.to(trainer_logp_B_T.dtype)
    log_w_B_T = (trainer_logp_B_T.detach() - engine_logp_B_T) * mask
    if level == "sequence":
        log_w_B_T = log_w_B_T.sum(-1, keepdim=True).expand_as(log_w_B_T)
    log_cap = math.log(cap)
    if mode == "tis":
        w_B_T = log_w_B_T.clamp(max=log_cap).exp()
    else:
        w_B_T = torch.where(log_w_B_T <= log_cap, log_w_B_T.clamp(max=log_cap).exp(),
                            torch.zeros_like(log_w_B_T))
    return w_B_T * mask


def importance_sums(w_B_T: torch.Tensor, mask_B_T: torch.Tensor) -> dict[str, float]:
    """Sums over policy tokens of the weight and of (weight == 0), for token means."""
    w = w_B_T[mask_B_T.bool()]
    return {"is_weight_mean": float(w.sum()), "is_zero_frac": float((w == 0).sum())}
