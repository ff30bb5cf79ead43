"""Importance-sampling correction between the engine that sampled and the trainer that learns,
and the measure of their gap (the train/inference mismatch).

The engine's log-probs differ from the trainer's (an older policy in async mode, other numerics
in any mode), so the policy-gradient term is weighted by w = pi_trainer / pi_engine (detached),
bounded (Yao et al. 2025; verl's rollout_is): tis truncates w at the cap, mis zeroes it above;
per token or per sequence (the summed log ratio, in log space). Config: `algorithm.is_correction`
/ `is_level` / `is_cap` (algorithms/config.py); 'auto' is tis in async mode, none in sync. The
mismatch, measured on every step in float64, is the mean |d| and mean k3 = expm1(d) - d, d = log
pi_trainer - log pi_engine: k3 estimates KL(engine || trainer) without bias (Schulman 2020).
Not covered: a lower bound for mis, geometric-mean sequence weights, weights on the KL term,
the mismatch of tokens the engine did not sample.
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
    def from_section(cls, algorithm, run_mode: str) -> ImportanceSpec:
        """From the `algorithm` section: is_correction 'auto' is tis with mode='async' (the
        samples are off-policy) and none with mode='sync'."""
        mode = algorithm.is_correction
        if mode == "auto":
            mode = "tis" if run_mode == "async" else "none"
        return cls(mode, algorithm.is_level, algorithm.is_cap)


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
