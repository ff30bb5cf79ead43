"""The load-balancing auxiliary loss of mixture-of-experts policies (`algorithm.moe_aux_loss_coef`).

The loss is the family's own: transformers' `load_balancing_loss_func` (Switch Transformer eqs.
4-6: E x sum_e f_e P_e, f_e the fraction of top-k assignments to expert e and P_e its mean
router probability, pooled over the MoE layers), over the router logits of the trainer's loss
pass (trainer/logprobs.py `completion_logprobs`: a prompt call, then a completion call).
Which tokens: the positions whose next-token log-prob is trained, each as often as it is
trained: the prompt's last position once per sample of its group whose first completion token
is a policy token, and each completion position whose next token is a policy token. Padding,
the rest of the prompt, environment tokens and each completion's last token (never forwarded)
do not count. This equals `load_balancing_loss_func` over a plain HF forward of each sample's
prompt + completion[:-1] with those positions as its mask (tests/moe/test_aux_loss.py).
The loss is not a sum over tokens: each micro-batch (and rank) computes it over its own tokens,
weighted by its share of the batch's policy tokens (one micro-batch: the batch's own loss).
With `algorithm.routing_replay` the routes are forced but the router logits are the router's
own: the loss measures (and its gradient balances, through P_e) what the trainer's router
would choose, not the replayed experts.
With LoRA its gradient reaches only what the adapters train (the routers stay frozen unless
lora.target_modules names them). Dense models: refused (config/rules.py where model.path is
known before loading, else here).
Not covered: gradient checkpointing (config/rules.py refuses it), the reference and value
passes (no loss there).
"""

from __future__ import annotations

import contextlib
import importlib

import torch

from traingym.core.errors import ConfigError
from traingym.models import moe


class AuxLoss:
    """The trainer's part: `collect` around the loss pass's forward, then `loss`."""

    def __init__(self, model, coef: float):
        self.model, self.coef = model, coef
        found = moe.routers(model) if coef > 0 else []
        if coef > 0 and not found:
            raise ConfigError("algorithm.moe_aux_loss_coef > 0 needs a mixture-of-experts "
                              f"model of a covered family ({', '.join(sorted(moe.ROUTERS))}); "
                              f"model_type {getattr(model.config, 'model_type', None)!r} has "
                              "no routers: set algorithm.moe_aux_loss_coef = 0")
        self.routers = found
        if found:
            config = getattr(model, "module", model).config
            family = importlib.import_module(
                f"transformers.models.{config.model_type}.modeling_{config.model_type}")
            self.fn = family.load_balancing_loss_func
            self.experts, self.top_k = found[0].num_experts, found[0].top_k

    @contextlib.contextmanager
    def collect(self):
        """Yields a list that gets, per forward call, each MoE layer's router logits (N, E)
        (with their graph); an empty list when the loss is off."""
        calls: list[list[torch.Tensor]] = []
        if not self.routers:
            yield calls
            return

        def hook(layer: int):
            def fn(router, args, out):
                if layer == 0:
                    calls.append([])
                calls[-1].append(out[0])
            return fn

        handles = [r.register_forward_hook(hook(i)) for i, r in enumerate(self.routers)]
        try:
            yield calls
        finally:
            for h in handles:
                h.remove()

    def loss(self, calls, prompts, completions, loss_masks) -> torch.Tensor | None:
        """The family's load-balancing loss over the trained positions (module docstring) of
        completion_logprobs' calls; None when no position is trained."""
        device = calls[0][0].device
        P, T = len(prompts), calls[0][0].shape[0] // len(prompts)
        first = torch.zeros(P, T, device=device)
        rows = [(p, m) for p, group in enumerate(loss_masks) for m in group]
        for p, m in rows:
            first[p, T - 1] += float(m[0])
        weights = [first.reshape(-1)]
        if len(calls) > 1:
            C = calls[1][0].shape[0] // len(rows)
            rest = torch.zeros(len(rows), C, device=device)
            for b, (_, m) in enumerate(rows):
                rest[b, : len(m) - 1] = torch.tensor(m[1:], dtype=rest.dtype)
            weights.append(rest.reshape(-1))
        mask = torch.cat(weights)
        if float(mask.sum()) == 0:
            return None
        layers = tuple(torch.cat([c[i] for c in calls]) for i in range(len(self.routers)))
        return self.fn(layers, self.experts, self.top_k, mask)
