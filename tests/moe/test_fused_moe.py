"""The fused decode path on MoE models (rollout/fused_moe.py), beyond the logits, generation
and training checks of tests/models/test_families.py: the block's output and chosen experts
equal HF's sparse MoE block's, in fp32, for both families; continuous batching (serve's
StepDecoder) runs on it; the fused path records no routes when not asked to; and the AMX
kernel (rollout/amx.py) gives the expert loop's bits at decode sizes, in a bf16 engine
too."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from moe_tiny import tiny_moe  # tests/ is on sys.path (tests/conftest.py)
from prereq import require_amx_kernels

from traingym.core.types import GenerationRequest, SamplingParams
from traingym.rollout import fused_moe
from traingym.rollout.fused_decoder import FusedDecoder
from traingym.rollout import amx
from traingym.rollout.fused_moe import MoeWeights, is_sparse, moe_mlp, moe_weights
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


def _experts(hidden, inter, E, seed=0):
    g = torch.Generator().manual_seed(seed)
    gate_up = (torch.randn(E, 2 * inter, hidden, generator=g) * hidden ** -0.5).bfloat16()
    down = (torch.randn(E, hidden, inter, generator=g) * inter ** -0.5).bfloat16()
    loop = MoeWeights(None, E, tuple(gate_up), tuple(down), 2, True, torch.bfloat16)
    return loop, loop._replace(gate_up=(), down=(), packed=(amx.pack(gate_up), amx.pack(down)))


def _routed(tokens, H, E, k, gate_dtype, seed=1):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, H, generator=g).bfloat16()
    top, ids = torch.topk((torch.randn(tokens, E, generator=g) * 2).softmax(-1), k, dim=-1)
    return x, ids, (top / top.sum(-1, keepdim=True)).to(gate_dtype)


@pytest.mark.parametrize("gate_dtype", [torch.bfloat16, torch.float32])  # Qwen3-MoE, Mixtral
@pytest.mark.parametrize("hidden,inter,tokens", [(64, 32, 7), (96, 96, 60), (768, 384, 16)])
def test_kernel_gives_the_expert_loops_bits(hidden, inter, tokens, gate_dtype):
    """Experts with no rows, one row and several, a block count that is not a multiple of four
    (96 / 16), the benchmark's shape (768, 384: 32 experts, top-4)."""
    require_amx_kernels()
    E, k = (32, 4) if hidden == 768 else (8, 2)
    loop, packed = _experts(hidden, inter, E)
    x, ids, top = _routed(tokens, hidden, E, k, gate_dtype)
    loop, packed = loop._replace(top_k=k), packed._replace(top_k=k)
    want = fused_moe._looped_experts(x, ids, top, loop, F.silu, F.linear)
    assert torch.equal(amx.moe(x, ids, top, *packed.packed), want)


def test_kernel_above_32_rows_an_expert_rounds_a_few_elements_differently():
    """Above 32 rows an expert (a prefill), the two round differently in a few elements, by one
    bf16 step (oneDNN's sums change order there; whether the exp adds to it, not isolated)."""
    require_amx_kernels()
    loop, packed = _experts(768, 384, 4)
    x, _, _ = _routed(200, 768, 4, 1, torch.float32)
    ids, top = torch.zeros(200, 1, dtype=torch.long), torch.ones(200, 1)
    want = fused_moe._looped_experts(x, ids, top, loop._replace(top_k=1), F.silu, F.linear)
    got = amx.moe(x, ids, top, *packed.packed)
    assert (got != want).float().mean() < 1e-2
    torch.testing.assert_close(got.float(), want.float(), rtol=2 ** -6, atol=1e-3)


def test_kernel_refuses_an_expert_id_out_of_range():
    require_amx_kernels()
    _, packed = _experts(64, 32, 8)
    x, ids, top = _routed(3, 64, 8, 2, torch.float32)
    with pytest.raises(ValueError, match="expert id 8 out of range"):
        amx.moe(x, ids.masked_fill(ids == ids[0, 0], 8), top, *packed.packed)


@pytest.mark.parametrize("family", ["qwen3_moe", "mixtral"])
@pytest.mark.parametrize("head_dim", [16, 32])  # 32: the decode attention's kernel too
def test_bf16_decoder_on_the_kernels_equals_it_without(family, head_dim, monkeypatch):
    """A bf16 tiny MoE: prefill and decode logits and the experts chosen, with the AMX kernels
    and without them (oneDNN and torch), bit for bit."""
    require_amx_kernels()
    model, _ = tiny_moe(family, head_dim=head_dim)
    model = model.to(torch.bfloat16)
    on = FusedDecoder(model)
    assert all(layer.moe.packed is not None for layer in on.layers)
    with monkeypatch.context() as m:
        m.setattr(fused_moe.amx, "lib", None)
        off = FusedDecoder(model)
    assert all(layer.moe.packed is None for layer in off.layers)
    assert on.kernel and not off.kernel  # the linears (and at head_dim 32 the attention) too
    ids = torch.randint(3, 400, (4, 9), generator=torch.Generator().manual_seed(0))
    mask, pos = torch.ones_like(ids), torch.arange(9).expand(4, 9)
    out = []
    for dec in (on, off):
        dec.routes = []
        logits, cache = dec.prefill(ids, mask, pos, 12)
        steps = [logits]
        for t in range(3):
            full = torch.ones(4, 10 + t, dtype=torch.long)
            steps.append(dec.decode(steps[-1].argmax(-1), pos[:, -1] + 1 + t, cache, 9 + t, full))
        out.append((steps, dec.routes))
    for a, b in zip(out[0][0], out[1][0]):
        assert torch.equal(a, b)
    assert all(torch.equal(a, b) for a, b in zip(out[0][1], out[1][1]))
