"""Rollout routing replay and the route mismatch, for mixture-of-experts policies.

The engine records, per sample, the experts each position was routed to (Sample.routes,
models/moe.py). On a covered MoE model the trainer's policy forwards (trainer/logprobs.py
`completion_logprobs`: one call over the groups' left-padded prompts, then one over the rows'
completions but their last token; the loss pass, and the no-grad passes for per-token
advantages and PPO's values) are laid out here position for position, and:
- with `algorithm.routing_replay`, every position the engine routed goes to the engine's
  experts, with the trainer's own gate weights over them (models/moe.py: the R3 variant);
- always, in the loss pass, it counts the (token, layer) pairs whose expert set differs from
  the engine's: `moe_route_mismatch` for the experts the forward used (0 under replay: they
  are the engine's), `moe_router_mismatch` for the experts the trainer's router would choose
  (the same as moe_route_mismatch without replay). Each is a fraction of the step's routed
  pairs.
Prompt positions take the group's first sample's routes (its n samples share one prefill).
Not covered: the reference model's pass (it routes on its own), gradient checkpointing (its
full-row path recomputes the forward in the backward pass), samples without routes (replay
refuses them; the mismatch is then not measured).
"""

from __future__ import annotations

import contextlib

import numpy as np
import torch

from traingym.core.errors import ConfigError
from traingym.models import moe

COUNTS = ("moe_route_differ", "moe_router_differ", "moe_route_pairs")


def forced_routes(groups, device) -> list[tuple[torch.Tensor, torch.Tensor]] | None:
    """Per forward call of completion_logprobs over `groups`, (ids (N, L, k), valid (N,));
    None when a sample carries no routes."""
    samples = [s for g in groups for s in g.samples]
    if not samples or any(s.routes is None for s in samples):
        return None
    L, K = samples[0].routes.shape[1:]
    dtype = samples[0].routes.dtype  # compact (uint8 / int16); widened per layer in the hook
    prompts = [g.samples[0] for g in groups]
    T = max(len(s.prompt_ids) for s in prompts)
    C = max(len(s.completion_ids) for s in samples) - 1
    calls = [(np.zeros((len(prompts), T, L, K), dtype), np.zeros((len(prompts), T), bool))]
    for p, s in enumerate(prompts):
        n = len(s.prompt_ids)
        got = s.routes[:n]
        calls[0][0][p, T - n: T - n + len(got)] = got
        calls[0][1][p, T - n: T - n + len(got)] = True
    if C > 0:
        calls.append((np.zeros((len(samples), C, L, K), dtype),
                      np.zeros((len(samples), C), bool)))
        for b, s in enumerate(samples):
            got = s.routes[len(s.prompt_ids): len(s.prompt_ids) + len(s.completion_ids) - 1]
            calls[1][0][b, : len(got)] = got
            calls[1][1][b, : len(got)] = True
    return [(torch.from_numpy(ids.reshape(-1, L, K)).to(device),
             torch.from_numpy(valid.reshape(-1)).to(device)) for ids, valid in calls]


class RouteReplay:
    """The trainer's part (module docstring). `replay`: algorithm.routing_replay."""

    def __init__(self, model, replay: bool, gradient_checkpointing: bool):
        self.model, self.replay = model, replay
        self.moe = bool(moe.routers(model)) and not gradient_checkpointing
        if replay and not moe.routers(model):
            raise ConfigError("algorithm.routing_replay needs a mixture-of-experts model of a "
                             f"covered family ({', '.join(sorted(moe.ROUTERS))}); "
                             f"model_type {getattr(model.config, 'model_type', None)!r} has "
                             "no routers: set algorithm.routing_replay = false")
        if replay and gradient_checkpointing:
            raise ConfigError("algorithm.routing_replay does not cover "
                             "trainer.gradient_checkpointing (the backward pass recomputes "
                             "the forward outside the replay): turn one of them off")

    @contextlib.contextmanager
    def forward(self, groups, stats: dict):
        """Around the policy forward over `groups`: replays (with `replay`) and adds the
        route counts to `stats`."""
        if not self.moe:
            yield
            return
        device = next(self.model.parameters()).device
        forced = forced_routes(groups, device)
        if forced is None:
            if self.replay:
                raise ValueError("algorithm.routing_replay: a sample carries no routes (its "
                                 "engine did not report them: rollout.engine needs "
                                 "abilities.reports_routes, e.g. 'torch')")
            yield
            return
        with moe.routing(self.model, forced if self.replay else None) as log:
            yield
        if len(log.chosen) != len(forced):
            raise RuntimeError(f"routing replay: {len(log.chosen)} forward calls, routes laid "
                               f"out for {len(forced)}")
        for (ids, valid), used, chosen in zip(forced, log.used, log.chosen):
            d_used, pairs = moe.differing(used, ids, valid)
            d_chosen, _ = moe.differing(chosen, ids, valid)
            for k, v in zip(COUNTS, (d_used, d_chosen, pairs)):
                stats[k] = stats.get(k, 0) + v


def route_fractions(stats: dict) -> dict:
    """`stats` with the route counts (summed over micro-batches and ranks) turned into the
    fractions it reports; unchanged where nothing was measured."""
    if COUNTS[2] not in stats:
        return stats
    pairs = stats.pop(COUNTS[2])
    route, router = stats.pop(COUNTS[0]), stats.pop(COUNTS[1])
    return {**stats, "moe_route_mismatch": route / pairs if pairs else None,
            "moe_router_mismatch": router / pairs if pairs else None}
