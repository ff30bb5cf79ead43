"""Policy-gradient losses as pure functions over per-token tensors.

GRPO with the PPO clipped ratio (Schulman et al. 2017) and token-level averaging over the whole
batch (DAPO, Yu et al. 2025), not the paper's per-sequence mean, so long completions are not
down-weighted. The optional KL to a reference uses the k3 estimator (Schulman 2020)
exp(ref - logp) - (ref - logp) - 1, added to the loss with weight `kl_coef` (off by default).
"""

from __future__ import annotations

import torch


def grpo_token_loss(
    logp_B_T: torch.Tensor,
    old_logp_B_T: torch.Tensor,
    advantages_B: torch.Tensor,
    clip_low: float,
    clip_high: float,
    ref_logp_B_T: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    is_weight_B_T: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-token loss, per-token k3 KL (zeros without a reference) and a clipped-token mask.
    `is_weight_B_T` (no grad; algorithms/importance.py) multiplies the policy-gradient term."""
    ratio_B_T = torch.exp(logp_B_T - old_logp_B_T)
    adv_B_1 = advantages_B[:, None]
    unclipped = ratio_B_T * adv_B_1
    clipped = ratio_B_T.clamp(1 - clip_low, 1 + clip_high) * adv_B_1
    loss_B_T = -torch.minimum(unclipped, clipped)
    if is_weight_B_T is not None:
        loss_B_T = loss_B_T * is_weight_B_T.detach()
    is_clipped_B_T = (clipped < unclipped).float()
    if ref_logp_B_T is not None:
        log_ratio = ref_logp_B_T - logp_B_T
        kl_B_T = torch.exp(log_ratio) - log_ratio - 1
        loss_B_T = loss_B_T + kl_coef * kl_B_T
    else:
        kl_B_T = torch.zeros_like(loss_B_T)
    return loss_B_T, kl_B_T, is_clipped_B_T


def clipped_surrogate(logp_B_T: torch.Tensor, old_logp_B_T: torch.Tensor, adv_B_T: torch.Tensor,
                      clip_low: float, clip_high: float) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO's per-token clipped surrogate -min(r A, clip(r, 1 - low, 1 + high) A), r =
    exp(logp - old), and where the clipped term was the smaller one (the token's gradient
    is cut). `adv_B_T` broadcasts: (B, 1) for per-sample advantages."""
    ratio_B_T = torch.exp(logp_B_T - old_logp_B_T)
    unclipped = ratio_B_T * adv_B_T
    clipped = ratio_B_T.clamp(1 - clip_low, 1 + clip_high) * adv_B_T
    return -torch.minimum(unclipped, clipped), (clipped < unclipped).float()


def kl_estimate(logp_B_T: torch.Tensor, ref_logp_B_T: torch.Tensor, estimator: str) -> torch.Tensor:
    """Per-token KL(pi || ref) estimates on tokens sampled from pi, d = log ref - log pi
    (Schulman 2020): k1 = -d (unbiased, can be negative), k2 = d^2 / 2, k3 = exp(d) - d - 1
    (unbiased, non-negative). Gradients flow through `logp_B_T`."""
    d = ref_logp_B_T - logp_B_T
    if estimator == "k1":
        return -d
    if estimator == "k2":
        return 0.5 * d * d
    if estimator == "k3":
        return torch.exp(d) - d - 1
    raise ValueError(f"kl estimator {estimator!r}; expected k1, k2 or k3")
