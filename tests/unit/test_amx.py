"""The AMX kernels (rollout/amx.py, _amx.c). The linear: oneDNN's bits at decode sizes, with and
without a bias and for out-features that are not a multiple of 16; each row's bits the same
whatever the batch; close to oneDNN above 32 rows, where oneDNN's own sums change order; bad
shapes refused. The decode attention: the torch path's bits at the MoE benchmark's shape, within
a bf16 step at longer caches, over views of a larger cache. The MoE entry is tested in
tests/moe/test_fused_moe.py."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from prereq import require_amx_kernels

from traingym.rollout import amx
from traingym.rollout.fused_decoder import FusedDecoder


@pytest.fixture(autouse=True)
def _kernels():
    require_amx_kernels()


def _weights(N, K, seed=0):
    g = torch.Generator().manual_seed(seed)
    return ((torch.randn(N, K, generator=g) * K ** -0.5).bfloat16(),
            torch.randn(N, generator=g).bfloat16())


def _x(rows, K, seed=1):
    return torch.randn(rows, K, generator=torch.Generator().manual_seed(seed)).bfloat16()


@pytest.mark.parametrize("N,K", [(768, 768), (1536, 768), (434, 768), (8, 64), (896, 4864)])
@pytest.mark.parametrize("rows", [1, 7, 32])
def test_linear_gives_onednns_bits_up_to_32_rows(N, K, rows):
    w, b = _weights(N, K)
    packed, x = amx.pack(w), _x(rows, K)
    assert torch.equal(amx.linear(x, packed), F.linear(x, w))
    assert torch.equal(amx.linear(x, packed, b), F.linear(x, w, b))
    assert torch.equal(amx.linear(x.view(1, rows, K), packed, b), F.linear(x, w, b)[None])


def test_each_rows_bits_do_not_depend_on_the_batch():
    w, b = _weights(1536, 768)
    packed, x = amx.pack(w), _x(200, 768)
    batch = amx.linear(x, packed, b)
    alone = torch.cat([amx.linear(x[i:i + 1], packed, b) for i in range(200)])
    assert torch.equal(batch, alone)
    onednn = F.linear(x, w, b)  # oneDNN blocks its sums another way above 32 rows
    assert (batch != onednn).float().mean() < 1e-3
    torch.testing.assert_close(batch.float(), onednn.float(), rtol=2 ** -7, atol=2 ** -7)


def test_linear_refuses_in_features_off_its_blocks():
    assert not amx.fits(48) and amx.fits(64)
    w = torch.zeros(16, 48, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="in features 48 must be a positive multiple of 32"):
        amx.linear(torch.zeros(2, 48, dtype=torch.bfloat16), amx.pack(w))
    packed = amx.pack(torch.zeros(16, 64, dtype=torch.bfloat16))
    with pytest.raises(TypeError, match="bf16 CPU tensors, got torch.float32"):
        amx.linear(torch.zeros(2, 64), packed)
    with pytest.raises(ValueError, match="x has 32 features, the weight takes 64"):
        amx.linear(torch.zeros(2, 32, dtype=torch.bfloat16), packed)


def _attention_inputs(B, H, KV, D, S, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, 1, D, generator=g).bfloat16()
    cache = torch.randn(2, B + 3, KV, S + 5, D, generator=g).bfloat16()  # a larger cache
    k, v = cache[0, :B, :, :S], cache[1, :B, :, :S]  # views, as continuous batching passes
    mask = torch.arange(S)[None, :] < torch.randint(1, S + 1, (B, 1), generator=g)
    return q, k, v, mask[:, None, None, :]


@pytest.mark.parametrize("B,H,KV,D,S", [(16, 4, 2, 192, 54), (3, 4, 2, 32, 12)])
def test_decode_attention_gives_the_torch_paths_bits(B, H, KV, D, S):
    """The MoE benchmark's shape and a small one: bit for bit the fused decoder's torch path."""
    q, k, v, mask = _attention_inputs(B, H, KV, D, S)
    assert amx.attention_fits(q, k, v)
    want = FusedDecoder._decode_attention(q, k, v, mask, D ** -0.5, None)
    assert torch.equal(amx.decode_attention(q, k, v, mask, D ** -0.5), want)


@pytest.mark.parametrize("B,H,KV,D,S", [(64, 14, 2, 64, 512), (16, 32, 2, 128, 1000)])
def test_decode_attention_is_the_torch_path_to_a_bf16_step(B, H, KV, D, S):
    """Longer caches and more heads per key/value head: the two sum in other orders (and
    exp differs in the last fp32 bits), so a few outputs differ, by one bf16 step."""
    q, k, v, mask = _attention_inputs(B, H, KV, D, S)
    want = FusedDecoder._decode_attention(q, k, v, mask, D ** -0.5, None)
    got = amx.decode_attention(q, k, v, mask, D ** -0.5)
    assert (got != want).float().mean() < 1e-2
    torch.testing.assert_close(got.float(), want.float(), rtol=2 ** -7, atol=2 ** -8)


def test_decode_attention_takes_only_what_it_covers():
    q, k, v, _ = _attention_inputs(2, 4, 2, 32, 8)
    assert not amx.attention_fits(q[..., :16], k[..., :16], v[..., :16])  # head_dim 16
    assert not amx.attention_fits(q.repeat(1, 9, 1, 1), k, v)  # 18 query heads per KV head
    assert not amx.attention_fits(q.float(), k.float(), v.float())
