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
