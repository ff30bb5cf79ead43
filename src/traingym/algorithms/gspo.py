"""GSPO: a sequence-level importance ratio, length-normalised, clipped per sequence.

Paper: Zheng et al. 2025, "Group Sequence Policy Optimization" (arXiv:2507.18071).
Config: `algorithm.name = "gspo"` (clip_low 3e-4, clip_high 4e-4: the paper's values).

s_i = exp(mean over the sample's policy tokens of (log pi - log pi_old)), in the GSPO-token
form s_i,t = sg[s_i] x pi_t / sg[pi_t]; a sample's loss is the mean over its tokens of
-min(s_i,t A_i, clip(s_i,t, 1 - low, 1 + high) A_i), the batch's the mean over its samples.

Departures: std normalisation off by default (the paper normalises; set normalize_std); one
optimizer step per batch, so s_i is 1 in value unless the importance correction moves it.
"""

from __future__ import annotations

import torch

from traingym.algorithms.base import Algorithm
from traingym.core.types import Batch


class GSPO(Algorithm):
    name = "gspo"
    DEFAULTS = {"clip_low": 3e-4, "clip_high": 4e-4}

    def token_loss(self, logp_B_T, old_logp_B_T, adv_B_T, mask_B_T):
        lengths_B = mask_B_T.sum(-1).clamp(min=1)
        log_s_B = ((logp_B_T - old_logp_B_T) * mask_B_T).sum(-1) / lengths_B
        s_B_T = torch.exp(log_s_B.detach()[:, None] + logp_B_T - logp_B_T.detach())
        k = self.knobs
        unclipped = s_B_T * adv_B_T
        clipped = s_B_T.clamp(1 - k.clip_low, 1 + k.clip_high) * adv_B_T
        return -torch.minimum(unclipped, clipped), (clipped < unclipped).float()

    def token_weights(self, mask_B_T: torch.Tensor) -> torch.Tensor:
        return mask_B_T / mask_B_T.sum(-1, keepdim=True).clamp(min=1)

    def denominator(self, batch: Batch) -> float:
        return float(sum(len(g.samples) for g in batch.groups))
