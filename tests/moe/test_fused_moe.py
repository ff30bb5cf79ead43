"""The fused decode path on MoE models (rollout/fused_moe.py), beyond the logits, generation
and training checks of tests/models/test_families.py: the block's output and chosen experts
equal HF's sparse MoE block's, in fp32, for both families; continuous batching (serve's
StepDecoder) runs on it; and the fused path records no routes when not asked to."""

from __future__ import annotations

import pytest
import torch
from moe_tiny import tiny_moe  # tests/ is on sys.path (tests/conftest.py)

from traingym.core.types import GenerationRequest, SamplingParams
from traingym.rollout.fused_moe import is_sparse, moe_mlp, moe_weights
from traingym.rollout.torch_engine import TorchEngine


@pytest.mark.parametrize("family", ["qwen3_moe", "mixtral", "qwen2_moe"])
@pytest.mark.parametrize("router_std", [1.0, 0.02])
def test_block_equals_hfs_sparse_moe_block(family, router_std):
    model, _ = tiny_moe(family, router_std=router_std)
    block = model.model.layers[0].mlp
    assert is_sparse(block)
    x = torch.randn(3, 5, 64, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want, want_ids = block(x), block.gate(x.reshape(-1, 64))[2]
        got, ids = moe_mlp(x, moe_weights(block), block.experts.act_fn)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    assert torch.equal(ids, want_ids)


def test_step_decoder_runs_on_the_fused_moe_path():
    model, tok = tiny_moe("qwen3_moe")
    engine = TorchEngine(model, tok.pad_token_id)
    assert engine.abilities.step_decoding and engine.fused is not None
    req = GenerationRequest((5, 9, 11, 4), 2, SamplingParams(0.9, max_new_tokens=6), seed=3)
    dec = engine.step_decoder()
    rows = dec.admit([req])[0]
    got = {r: [] for r in rows}
    while dec.live:
        for t in dec.step():
            got[t.row].append(t.token)
    alone = engine.generate_sync([req])[0]
    assert [got[r] for r in rows] == [c.token_ids for c in alone]
    assert engine.fused.routes is None  # recorded only inside generate
