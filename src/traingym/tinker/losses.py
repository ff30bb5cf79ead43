"""Tinker's built-in losses, per datum, as Tinker defines them: a SUM over tokens (and over the
datums of a request), never a mean; the weights/advantages carry any masking or scaling.

Per token t, with logp_t the model's log-prob of target_tokens[t] and old_t the sampler's
(`logprobs` input), r_t = exp(logp_t - old_t), A_t the `advantages` input:

- cross_entropy:       -logp_t * weights_t                   (weights default to 1)
- importance_sampling: -r_t * A_t
- ppo:                 -min(r_t A_t, clip(r_t, low, high) A_t)  (algorithms/losses.py's
                       clipped_surrogate, low = 1 - clip_low, high = 1 + clip_high)
- cispo:               -sg(clip(r_t, low, high)) * A_t * logp_t (algorithms/cispo.py's weight)

`low` / `high` are the loss_fn_config keys clip_low_threshold / clip_high_threshold (ratios,
default 0.8 / 1.2). Refused: dro, gspo, stable_reinforce and custom (server-side custom losses)
- their definitions need state this server does not keep; the SDK's forward_backward_custom
runs the custom loss on the client and sends cross_entropy, which works.
"""

from __future__ import annotations

import numpy as np
import torch

from traingym.algorithms.losses import clipped_surrogate
from traingym.tinker.futures import UserError

INPUTS = {  # loss -> (required inputs, optional inputs)
    "cross_entropy": ({"target_tokens"}, {"weights"}),
    "importance_sampling": ({"target_tokens", "logprobs", "advantages"}, set()),
    "ppo": ({"target_tokens", "logprobs", "advantages"}, set()),
    "cispo": ({"target_tokens", "logprobs", "advantages"}, set()),
}
CONFIG = {"cross_entropy": set(), "importance_sampling": set(),
          "ppo": {"clip_low_threshold", "clip_high_threshold"},
          "cispo": {"clip_low_threshold", "clip_high_threshold"}}
REFUSED = {"dro", "gspo", "stable_reinforce", "custom"}


def check(loss_fn: str, config: dict, inputs: list[dict], lengths: list[int]) -> None:
    """UserError naming the problem: unknown loss, missing / extra inputs, wrong lengths."""
    if loss_fn not in INPUTS:
        why = ("is not supported by traingym's Tinker server" if loss_fn in REFUSED
               else "is not a Tinker loss")
        raise UserError(f"loss_fn {loss_fn!r} {why}; supported: {sorted(INPUTS)}")
    unknown = set(config) - CONFIG[loss_fn]
    if unknown:
        raise UserError(f"loss_fn_config keys {sorted(unknown)} do not apply to {loss_fn!r} "
                        f"(it takes {sorted(CONFIG[loss_fn]) or 'none'})")
    for k, v in config.items():
        if not isinstance(v, float):
            raise UserError(f"loss_fn_config[{k!r}] must be a number")
    need, may = INPUTS[loss_fn]
    for i, (names, n) in enumerate(zip(inputs, lengths)):
        if n < 1:
            raise UserError(f"datum {i}: empty model_input")
        if need - set(names):
            raise UserError(f"datum {i}: {loss_fn!r} needs loss_fn_inputs "
                            f"{sorted(need - set(names))}")
        if set(names) - need - may:
            raise UserError(f"datum {i}: loss_fn_inputs {sorted(set(names) - need - may)} do "
                            f"not apply to {loss_fn!r} (it takes {sorted(need | may)})")
        for k, arr in names.items():
            if len(arr) != n:
                raise UserError(f"datum {i}: loss_fn_inputs[{k!r}] has {len(arr)} values for "
                                f"{n} input tokens (one per token)")


def weights(loss_fn: str, inputs: dict) -> np.ndarray:
    """Per token the factor its loss and gradient scale with (cross_entropy's weights, the RL
    losses' advantages): where it is 0 the token's loss and gradient are 0 (finite log-probs)."""
    name = "weights" if loss_fn == "cross_entropy" else "advantages"
    if name not in inputs:
        return np.ones(len(inputs["target_tokens"]), dtype=np.float32)
    return np.asarray(inputs[name], dtype=np.float32)


def elementwise(loss_fn: str, logp_T: torch.Tensor, inputs: dict[str, torch.Tensor],
                config: dict) -> torch.Tensor:
    """Per-token loss of one datum, (T,); its sum is the datum's loss."""
    if loss_fn == "cross_entropy":
        weights = inputs.get("weights")
        return -logp_T * (weights if weights is not None else torch.ones_like(logp_T))
    old_T, adv_T = inputs["logprobs"], inputs["advantages"]
    low = config.get("clip_low_threshold", 0.8)
    high = config.get("clip_high_threshold", 1.2)
    if loss_fn == "importance_sampling":
        return -torch.exp(logp_T - old_T) * adv_T
    if loss_fn == "ppo":
        return clipped_surrogate(logp_T, old_T, adv_T, 1 - low, high - 1)[0]
    if loss_fn == "cispo":
        weight_T = torch.exp(logp_T - old_T).detach().clamp(low, high)
        return -weight_T * adv_T * logp_T
    raise UserError(f"loss_fn {loss_fn!r} is not supported")
