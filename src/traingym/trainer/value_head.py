"""The value head that an algorithm with `needs_values` (algorithms/ppo.py) asks the trainer for.

A linear layer (hidden -> 1) on the LM head's input (trainer/logprobs.py `hidden=True`), so V_t
is the value of the state before token t; the trunk is shared with the policy, as in TRL, not a
separate critic. Zero-initialised (it draws nothing from the RNG, so a run's random stream is
the same with or without it), float32. It lives on the trainer, never on the model: exports
and model.safetensors hold the policy only. The policy's optimizer trains it (lr x
`algorithm.value_lr_scale`) and checkpoints save it as value_head.safetensors
(runs/checkpoint.py `extra`). `value_targets` is the no-grad pass before the update.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from traingym.algorithms.ppo import explained_variance


def make_value_head(model) -> torch.nn.Linear:
    hidden = model.get_output_embeddings().in_features
    device = next(model.parameters()).device
    head = torch.nn.Linear(hidden, 1, device=device, dtype=torch.float32, bias=True)
    with torch.no_grad():
        head.weight.zero_()
        head.bias.zero_()
    return head


def values_of(head: torch.nn.Linear, hidden_B_T_H: torch.Tensor, mask_B_T: torch.Tensor
              ) -> torch.Tensor:
    """V (B, T), float32, 0 off the mask (run outside autocast: the head stays float32)."""
    return head(hidden_B_T_H.float())[..., 0] * mask_B_T


@dataclass
class ValueTargets:
    advantages: list[torch.Tensor]  # per micro-batch (B, T)
    returns: list[torch.Tensor]
    old_values: list[torch.Tensor]
    stats: dict  # value_mean, value_return_mean, value_explained_var over the batch


def value_targets(trainer, chunks, rows, refs) -> ValueTargets:
    """One no-grad pass of the policy over the batch: V_old (and the KL to the reference
    when `kl_in = 'reward'`), then the algorithm's advantages and returns."""
    algo, knobs = trainer.algorithm, trainer.algorithm.knobs
    parts = []
    for (chunk, advantages), r, ref in zip(chunks, rows, refs):
        with torch.no_grad():
            with trainer._autocast(), trainer.routes.forward(chunk, {}):  # MoE: replay.py
                out = trainer.logprobs(trainer.forward_model, *r, hidden=True)
            mask = out.mask_B_T.float()
            values = values_of(trainer.value_head, out.hidden_B_T_H, mask)
            kl = torch.zeros_like(values)
            if ref is not None and knobs.kl_in == "reward":
                kl = algo.kl(out.logp_B_T.float(), ref) * mask
        reward_B = torch.tensor([a for adv in advantages for a in adv], dtype=torch.float32,
                                device=values.device)
        parts.append((reward_B, kl, values, mask))
    advs, rets = algo.value_advantages(parts)
    keep = [p[3] > 0 for p in parts]
    v_flat = torch.cat([p[2][k] for p, k in zip(parts, keep)])
    r_flat = torch.cat([r[k] for r, k in zip(rets, keep)])
    stats = {"value_mean": float(v_flat.mean()), "value_return_mean": float(r_flat.mean()),
             "value_explained_var": explained_variance(v_flat, r_flat)}
    return ValueTargets([a.float() for a in advs], [r.float() for r in rets],
                        [p[2] for p in parts], stats)
