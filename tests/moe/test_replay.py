"""Routing replay in the trainer (trainer/replay.py) on tiny random-init MoE models
(tests/moe_tiny.py: Qwen3-MoE, Mixtral, Qwen2-MoE): samples from the built-in engine, one
train step each.

- fp32 engine and trainer, replay on: the trainer's log-probs are the engine's (mean |d| <
  1e-5, and each token's within 1e-5 of the fused engine's) and no route differs;
- perturbed trainer routers (or a bf16 engine): without replay some routes differ
  (moe_route_mismatch > 0); with replay moe_route_mismatch is 0 while moe_router_mismatch
  (what the trainer's router would choose) stays > 0;
- refusals: replay on a dense model, on samples without routes, with gradient checkpointing.
"""

from __future__ import annotations

import copy

import pytest
import torch
from moe_tiny import tiny_moe  # tests/ is on sys.path (tests/conftest.py)

import traingym
from traingym.algorithms.base import Knobs
from traingym.algorithms.grpo import GRPO
from traingym.core.types import Batch, GenerationRequest, Group, Observation, SamplingParams
from traingym.envs.single_turn import to_sample
from traingym.rollout.torch_engine import TorchEngine
from traingym.trainer.torch_trainer import TorchTrainer

FAMILIES = ("qwen3_moe", "mixtral", "qwen2_moe")


def _batch(engine, tok, prompts=((5, 9, 11, 4), (7, 8), (12, 3, 6)), n=3, tokens=8):
    params = SamplingParams(temperature=1.0, max_new_tokens=tokens)
    reqs = [GenerationRequest(p, n=n, params=params, seed=i) for i, p in enumerate(prompts)]
    groups = []
    for i, (req, comps) in enumerate(zip(reqs, engine.generate_sync(reqs))):
        obs = Observation(req.prompt_ids)
        groups.append(Group([to_sample({}, obs, c, tok) for c in comps], i))
    adv = [[1.0, -1.0, 0.5][:n] for _ in groups]
    return Batch(groups, adv)


def _step(model, tok, batch, replay: bool, **trainer):
    cfg = traingym.build_config("tiny", overrides={"trainer": {"lr": 1e-3, **trainer}})
    t = TorchTrainer(copy.deepcopy(model), cfg.trainer, 1.0, tok.pad_token_id,
                     algorithm=GRPO(Knobs(routing_replay=replay)))
    return t.train_step(batch)


@pytest.mark.parametrize("family", FAMILIES)
def test_fp32_replay_gives_the_engines_logprobs(family):
    model, tok = tiny_moe(family)
    batch = _batch(TorchEngine(copy.deepcopy(model), tok.pad_token_id), tok)
    for replay in (False, True):
        m = _step(model, tok, batch, replay)
        assert m["mismatch_abs_logp"] < 1e-5, (replay, m)
        assert m["moe_route_mismatch"] == 0.0 and m["moe_router_mismatch"] == 0.0, m


def _perturbed(model, std=0.3, seed=1):
    """The model with noise on its router weights: some tokens route elsewhere."""
    other = copy.deepcopy(model)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for layer in other.model.layers:
            w = layer.mlp.gate.weight
            w.add_(torch.randn(w.shape, generator=g) * std)
    return other


@pytest.mark.parametrize("family", FAMILIES)
def test_replay_removes_the_route_mismatch_of_perturbed_routers(family):
    model, tok = tiny_moe(family)
    batch = _batch(TorchEngine(copy.deepcopy(model), tok.pad_token_id), tok)
    trainer_model = _perturbed(model)
    off = _step(trainer_model, tok, batch, replay=False)
    on = _step(trainer_model, tok, batch, replay=True)
    assert 0.0 < off["moe_route_mismatch"] == off["moe_router_mismatch"] < 1.0, off
    assert on["moe_route_mismatch"] == 0.0, on
    assert on["moe_router_mismatch"] > 0.0, on  # the trainer's router still disagrees
    assert on["mismatch_abs_logp"] < off["mismatch_abs_logp"], (on, off)


@pytest.mark.parametrize("family", FAMILIES)
def test_bf16_engine_routes_differ_and_replay_aligns_them(family):
    """HF's own router init (std 0.02): near-uniform routing, which bf16 flips."""
    model, tok = tiny_moe(family, router_std=0.02)
    engine = TorchEngine(copy.deepcopy(model), tok.pad_token_id, dtype=torch.bfloat16)
    prompts = [tuple(range(3 + i, 9 + 2 * i)) for i in range(6)]
    batch = _batch(engine, tok, prompts=prompts, n=3, tokens=24)
    off = _step(model, tok, batch, replay=False)
    on = _step(model, tok, batch, replay=True)
    assert off["moe_route_mismatch"] > 0.0, off
    assert on["moe_route_mismatch"] == 0.0 and on["moe_router_mismatch"] > 0.0, on


def test_replay_refuses_a_dense_model():
    from traingym.models.loader import load_policy

    model, tok = load_policy("tiny")
    cfg = traingym.build_config("tiny")
    with pytest.raises(ValueError, match="needs a mixture-of-experts model"):
        TorchTrainer(model, cfg.trainer, 1.0, tok.pad_token_id,
                     algorithm=GRPO(Knobs(routing_replay=True)))


def test_replay_refuses_samples_without_routes():
    model, tok = tiny_moe()
    batch = _batch(TorchEngine(copy.deepcopy(model), tok.pad_token_id), tok)
    for g in batch.groups:
        for s in g.samples:
            s.routes = None
    with pytest.raises(ValueError, match="carries no routes"):
        _step(model, tok, batch, replay=True)
    m = _step(model, tok, batch, replay=False)  # without replay: not measured
    assert "moe_route_mismatch" not in m


def test_replay_refuses_gradient_checkpointing():
    model, tok = tiny_moe()
    cfg = traingym.build_config("tiny", overrides={"trainer": {"gradient_checkpointing": True}})
    with pytest.raises(ValueError, match="gradient_checkpointing"):
        TorchTrainer(model, cfg.trainer, 1.0, tok.pad_token_id,
                     algorithm=GRPO(Knobs(routing_replay=True)))


@pytest.mark.parametrize("algorithm,passes", [
    ({"name": "grpo"}, 1),  # the loss pass
    ({"name": "grpo", "kl_coef": 0.1, "kl_in": "reward"}, 2),  # + per-token advantages
    ({"name": "ppo"}, 2)])  # + PPO's values
def test_every_policy_pass_replays(monkeypatch, algorithm, passes):
    from traingym.loop.trainer import build_trainer
    from traingym.trainer import replay

    model, tok = tiny_moe()
    batch = _batch(TorchEngine(copy.deepcopy(model), tok.pad_token_id), tok)
    forced = []
    real = replay.moe.routing

    def spy(m, given=None):
        forced.append(given is not None)
        return real(m, given)

    monkeypatch.setattr(replay.moe, "routing", spy)
    cfg = traingym.build_config("tiny", overrides={
        "algorithm": {**algorithm, "routing_replay": True},
        "trainer": {"micro_batch_groups": 8}})
    m = build_trainer(cfg, _perturbed(model), tok.pad_token_id).train_step(batch)
    assert forced == [True] * passes
    assert m["moe_route_mismatch"] == 0.0 and m["moe_router_mismatch"] > 0.0


@pytest.mark.parametrize("family", FAMILIES)
def test_replayed_routes_give_the_engines_per_token_logprobs(family):
    """Per token, not on average: the fused engine's fp32 log-probs against the trainer's
    shared-prompt forward (trainer/logprobs.py) with the engine's recorded routes replayed."""
    from traingym.trainer.logprobs import completion_logprobs
    from traingym.trainer.replay import RouteReplay

    model, tok = tiny_moe(family)
    engine = TorchEngine(copy.deepcopy(model), tok.pad_token_id)
    assert engine.fused is not None  # the fused decode path (rollout/fused_moe.py)
    batch = _batch(engine, tok)
    rows = ([g.samples[0].prompt_ids for g in batch.groups],
            [[s.completion_ids for s in g.samples] for g in batch.groups], 1.0,
            tok.pad_token_id)
    stats = {}
    with torch.no_grad(), RouteReplay(model, True, False).forward(batch.groups, stats):
        got_B_T = completion_logprobs(model, *rows).logp_B_T
    assert stats["moe_route_pairs"] > 0 and stats["moe_route_differ"] == 0, stats
    samples = [s for g in batch.groups for s in g.samples]
    err = max(abs(got_B_T[b, t].item() - lp) for b, s in enumerate(samples)
              for t, lp in enumerate(s.completion_logprobs))
    assert err < 1e-5, err
