"""CISPO: clipped importance-sampling weights, stop-gradient, gradient through every token.

Paper: MiniMax 2025, "MiniMax-M1: Scaling Test-Time Compute Efficiently with Lightning
Attention" (arXiv:2506.13585), section 3.1. Config: `algorithm.name = "cispo"`.

Per token: -sg(clip(r_t, 1 - clip_low, 1 + clip_high)) x A_i x log pi_t, r_t = pi_t / pi_old,t.
Unlike PPO's clip, no token's gradient is dropped: the weight is bounded, the gradient still
flows through log pi_t. Loss averaged over the batch's policy tokens; advantages GRPO's
group-relative ones. `clip_frac` counts tokens whose ratio was outside the range.

Departures: defaults clip_low 1.0 (no lower bound, as the paper) and clip_high 4.0 (the paper
tunes eps_high and does not fix it; 4.0 is our choice); std normalisation off by default.
"""

from __future__ import annotations

import torch

from traingym.algorithms.base import Algorithm


class CISPO(Algorithm):
    name = "cispo"
    DEFAULTS = {"clip_low": 1.0, "clip_high": 4.0}

    def token_loss(self, logp_B_T, old_logp_B_T, adv_B_T, mask_B_T):
        k = self.knobs
        ratio_B_T = torch.exp(logp_B_T - old_logp_B_T).detach()
        weight_B_T = ratio_B_T.clamp(1 - k.clip_low, 1 + k.clip_high)
        outside = ((ratio_B_T < 1 - k.clip_low) | (ratio_B_T > 1 + k.clip_high)).float()
        return -weight_B_T * adv_B_T * logp_B_T, outside
