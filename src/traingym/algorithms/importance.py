"""Importance-sampling correction between the engine that sampled and the trainer that learns,
and the measure of how far apart the two are (the train/inference mismatch).

A sample's tokens were drawn by the engine, whose log-probs can differ from the trainer's on
the same tokens: in asynchronous mode the sample comes from an older policy, and in any mode
the engine's numerics differ (bf16 weights, fused kernels, another library such as vLLM). The
policy gradient then needs the weight w = pi_trainer(token) / pi_engine(token), computed from
the trainer's recomputed log-probs (detached: the weight carries no gradient) and the log-probs
the engine recorded. Large weights explode the variance, so they are bounded (Yao et al. 2025,
"Your efficient RL framework secretly brings you off-policy RL training"; verl's rollout_is
options):

- tis (truncated): w -> min(w, cap).
- mis (masked): w -> w if w <= cap else 0 (the token, or the whole sequence, drops out).
- token level: one weight per policy token.
- sequence level: one weight per sample, exp(sum over its policy tokens of the log ratio),
  shared by all of its tokens (computed in log space, so no overflow before the cap).

The run's choice is `algorithm.is_correction` / `is_level` / `is_cap` (config.py), resolved by
`ImportanceSpec.from_config`: 'auto' is tis in async mode and none in sync mode.

Mismatch (`mismatch_sums`), measured on every step whatever the correction: with d = log
pi_trainer - log pi_engine per policy token, the mean |d| (`mismatch_abs_logp`) and the mean
k3 = (r - 1) - log r = expm1(d) - d with r = exp(d) (`mismatch_kl_k3`). The tokens were sampled
from the engine, so the mean of k3 is an unbiased, non-negative estimate of KL(engine ||
trainer) (Schulman, "Approximating KL divergence", 2020); both are 0 exactly when the log-probs
are equal. Computed in float64.

Not covered: a lower bound for mis (weights near 0 are kept), geometric-mean sequence weights,
weights on the KL term (the weight multiplies the policy-gradient term only); the mismatch of
tokens the engine would have sampled but did not (only sampled tokens are compared).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class ImportanceSpec:
    """The correction a trainer applies: mode none | tis | mis, level token | sequence, cap."""

    mode: str
    level: str = "token"
    cap: float = 2.0

    @classmethod
    def from_config(cls, cfg) -> ImportanceSpec:
        """From a run's Config: algorithm.is_correction 'auto' is tis with mode='async' (the
        samples are off-policy) and none with mode='sync'."""
        t = cfg.algorithm
        mode = t.is_correction
        if mode == "auto":
            mode = "tis" if cfg.mode == "async" else "none"
        return cls(mode, t.is_level, t.is_cap)


def log_ratios(trainer_logp_B_T: torch.Tensor, engine_logp_B_T: torch.Tensor,
               mask_B_T: torch.Tensor, level: str) -> torch.Tensor:
    """log w per token (B, T), 0 where masked; at sequence level each row's sum, repeated."""
    mask = mask_B_T.to(trainer_logp_B_T.dtype)
    log_w_B_T = (trainer_logp_B_T.detach() - engine_logp_B_T) * mask
    if level == "sequence":
        log_w_B_T = log_w_B_T.sum(-1, keepdim=True).expand_as(log_w_B_T)
    return log_w_B_T


def importance_weights(trainer_logp_B_T: torch.Tensor, engine_logp_B_T: torch.Tensor,
                       mask_B_T: torch.Tensor, mode: str, level: str, cap: float) -> torch.Tensor:
    """Per-token weights (B, T), 0 where `mask_B_T` is 0. mode: none | tis | mis."""
    if mode == "none":
        return mask_B_T.to(trainer_logp_B_T.dtype)
    if mode not in ("tis", "mis") or level not in ("token", "sequence"):
        raise ValueError(f"importance_weights: mode {mode!r} / level {level!r}; expected "
                         "none|tis|mis and token|sequence")
    mask = mask_B_T.to(trainer_logp_B_T.dtype)
    log_w_B_T = log_ratios(trainer_logp_B_T, engine_logp_B_T, mask_B_T, level)
    log_cap = math.log(cap)
    if mode == "tis":
        w_B_T = log_w_B_T.clamp(max=log_cap).exp()
    else:
        w_B_T = torch.where(log_w_B_T <= log_cap, log_w_B_T.clamp(max=log_cap).exp(),
                            torch.zeros_like(log_w_B_T))
    return w_B_T * mask


def importance_sums(w_B_T: torch.Tensor, mask_B_T: torch.Tensor,
                    over_cap_B_T: torch.Tensor | None = None) -> dict[str, float]:
    """Sums over policy tokens of the weight, of (weight == 0) and, given `over_cap_B_T`
    (log ratio above log cap: truncated under tis, zeroed under mis), of that; divided by the
    policy-token count they are the step's `is_weight_mean`, `is_zero_frac`, `is_capped_frac`."""
    keep = mask_B_T.bool()
    w = w_B_T[keep]
    sums = {"is_weight_mean": float(w.sum()), "is_zero_frac": float((w == 0).sum())}
    if over_cap_B_T is not None:
        sums["is_capped_frac"] = float(over_cap_B_T[keep].sum())
    return sums


def over_cap(trainer_logp_B_T: torch.Tensor, engine_logp_B_T: torch.Tensor,
             mask_B_T: torch.Tensor, level: str, cap: float) -> torch.Tensor:
    """Policy tokens (bool, B x T) whose ratio (token or sequence level) is above `cap`."""
    log_w_B_T = log_ratios(trainer_logp_B_T, engine_logp_B_T, mask_B_T, level)
    return (log_w_B_T > math.log(cap)) & mask_B_T.bool()


def mismatch_sums(trainer_logp_B_T: torch.Tensor, engine_logp_B_T: torch.Tensor,
                  mask_B_T: torch.Tensor) -> dict[str, float]:
    """Sums over policy tokens (mask 1) of |d| and of k3 = expm1(d) - d, d = trainer - engine
    log-prob; divided by the policy-token count they are `mismatch_abs_logp` and
    `mismatch_kl_k3`. Tokens under mask 0 (environment tokens, padding) count for nothing."""
    keep = mask_B_T.bool()
    d = trainer_logp_B_T.detach().double()[keep] - engine_logp_B_T.double()[keep]
    return {"mismatch_abs_logp": float(d.abs().sum()),
            "mismatch_kl_k3": float((torch.expm1(d) - d).sum())}
