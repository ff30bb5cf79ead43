"""Routes of tiny random-init MoE models (tests/moe_tiny.py: the real Qwen3-MoE and Mixtral
classes): models/moe.py records what HF's routers choose and forces given routes; the built-in
engine's completions carry them (rollout/torch_engine.py)."""

from __future__ import annotations

import copy

import pytest
import torch
from moe_tiny import tiny_moe  # tests/ is on sys.path (tests/conftest.py)

from traingym.core.types import GenerationRequest, SamplingParams
from traingym.models import moe
from traingym.rollout.torch_engine import TorchEngine

FAMILIES = ("qwen3_moe", "mixtral", "qwen2_moe")


@pytest.fixture(scope="module", params=FAMILIES)
def tiny(request):
    return tiny_moe(request.param)


def _ids(tok, n=2, t=6, seed=0):
    return torch.randint(3, len(tok), (n, t), generator=torch.Generator().manual_seed(seed))


def test_recorded_routes_are_the_routers_top_k(tiny):
    model, tok = tiny
    x = _ids(tok)
    with moe.routing(model) as log:
        out = model(input_ids=x, output_router_logits=True)
    assert len(log.chosen) == 1 and log.chosen[0].shape == (12, 2, 2)  # (B*T, layers, k)
    for layer, logits in enumerate(out.router_logits):
        want = torch.topk(logits.float().softmax(-1), 2, dim=-1).indices
        assert torch.equal(log.chosen[0][:, layer], want)
    assert torch.equal(log.used[0], log.chosen[0])


def test_forcing_the_routers_choice_changes_nothing(tiny):
    model, tok = tiny
    x = _ids(tok)
    with torch.no_grad(), moe.routing(model) as log:
        want = model(input_ids=x).logits
    valid = torch.ones(12, dtype=torch.bool)
    flipped = log.chosen[0].flip(-1)  # the same sets, the other order
    with torch.no_grad(), moe.routing(model, [(flipped, valid)]):
        got = model(input_ids=x).logits
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)


def test_forced_routes_are_used_and_keep_router_gradients(tiny):
    model, tok = tiny
    model = copy.deepcopy(model)
    x = _ids(tok)
    with torch.no_grad(), moe.routing(model) as log:
        base = model(input_ids=x).logits
    other = (log.chosen[0] + 3) % 8  # every token elsewhere
    valid = torch.ones(12, dtype=torch.bool)
    valid[0] = False  # the first position keeps its own choice
    with moe.routing(model, [(other, valid)]) as forced:
        logits = model(input_ids=x).logits
    assert torch.equal(forced.used[0][1:], other[1:])
    assert torch.equal(forced.used[0][0], log.chosen[0][0])
    assert not torch.allclose(logits, base)
    logits.sum().backward()
    gate = moe.routers(model)[0].weight
    assert gate.grad is not None and gate.grad.abs().sum() > 0


def test_forcing_refuses_routes_of_another_shape(tiny):
    model, tok = tiny
    bad = torch.zeros(5, 2, 2, dtype=torch.long)
    with pytest.raises(ValueError, match="forced routes"), torch.no_grad():
        with moe.routing(model, [(bad, torch.ones(5, dtype=torch.bool))]):
            model(input_ids=_ids(tok))


def test_a_dense_model_has_no_routers():
    from traingym.models.loader import load_policy

    model, _ = load_policy("tiny")
    assert moe.routers(model) == []


def test_route_dtype():
    assert moe.route_dtype(128) == torch.uint8 and moe.route_dtype(257) == torch.int16


@pytest.mark.parametrize("fused", [False, True], ids=["hf", "fused"])
def test_engine_completions_carry_the_routes_of_each_position(tiny, fused):
    """Every completion's routes equal those of one unpadded HF forward over its prompt and
    tokens but the last (fp32; the router weights' std 1 keeps choices clear of ties), on the
    HF decode path and on the fused one (rollout/fused_moe.py)."""
    model, tok = tiny
    engine = TorchEngine(copy.deepcopy(model), tok.pad_token_id, fused=fused)
    assert (engine.fused is not None) == fused and engine.abilities.reports_routes
    params = SamplingParams(temperature=1.0, max_new_tokens=6)
    reqs = [GenerationRequest((5, 9, 11, 4), n=3, params=params, seed=1),
            GenerationRequest((7, 8), n=2, params=params, seed=2)]
    comps = [c for cs in engine.generate_sync(reqs) for c in cs]
    assert len(comps) == 5
    for c in comps:
        n = len(c.prompt_ids) + len(c.token_ids) - 1
        assert c.routes.shape == (n, 2, 2) and c.routes.dtype == "uint8"
        with torch.no_grad(), moe.routing(model) as log:
            model(input_ids=torch.tensor([list(c.prompt_ids) + c.token_ids[:-1]]))
        want = log.chosen[0].sort(-1).values
        assert torch.equal(torch.from_numpy(c.routes).long().sort(-1).values, want)


def test_a_multi_turn_sample_carries_its_last_turns_routes_over_the_whole_context(tiny):
    from traingym.envs.transcript import Transcript

    model, tok = tiny
    engine = TorchEngine(copy.deepcopy(model), tok.pad_token_id)
    params = SamplingParams(temperature=1.0, max_new_tokens=4)
    prompt = (5, 9, 11, 4)
    first = engine.generate_sync([GenerationRequest(prompt, 1, params, seed=1)])[0][0]
    t = Transcript(prompt)
    t.add_policy(first)
    t.add_env([7, 8, 3])
    second = engine.generate_sync([GenerationRequest(t.context, 1, params, seed=2)])[0][0]
    t.add_policy(second)
    sample = t.to_sample({}, tok, "", "length")
    assert sample.routes is second.routes
    assert len(sample.routes) == len(prompt) + len(sample.completion_ids) - 1


def test_a_sample_refuses_routes_beyond_its_tokens():
    import numpy as np

    from traingym.core.types import Sample

    with pytest.raises(ValueError, match="routes for 4 positions"):
        Sample((1, 2), [3], [0.0], [0], {}, routes=np.zeros((4, 2, 2), np.uint8))
