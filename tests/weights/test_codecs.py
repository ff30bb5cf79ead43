"""Codec round trips: every dtype the codec claims, any shape, densities 0..100%, special
values (NaN payloads, infinities, -0.0, subnormals), and the wire format."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from traingym.weights import entropy
from traingym.weights.base import IntegrityError
from traingym.weights.codecs import DeltaCodec, FullCodec, apply, changed_positions
from traingym.weights.frame import from_buffer, seal, to_bytes, verify_body
from traingym.weights.hashing import bits, state_hash

torch.set_num_threads(1)
DTYPES = [torch.bfloat16, torch.float16, torch.float32]
_INT = {2: torch.int16, 4: torch.int32}
SPECIAL = {  # bit patterns: +-0, +-inf, quiet/signalling NaNs with payloads, subnormals, max
    2: [0x0000, 0x8000, 0x7F80, 0xFF80, 0x7FC1, 0xFF81, 0x7F81, 0x0001, 0x8001, 0x7F7F,
        0x7C00, 0xFC00, 0x7E01, 0x7C01],
    4: [0x00000000, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00123, 0xFF800001, 0x00000001,
        0x807FFFFF, 0x7F7FFFFF],
}


def _from_bits(b: np.ndarray, dtype: torch.dtype, shape) -> torch.Tensor:
    width = torch.tensor([], dtype=dtype).element_size()
    return torch.from_numpy(b.astype(f"u{width}").view(f"i{width}")).view(dtype).reshape(shape)


def _same_bits(x: dict, y: dict) -> bool:
    return set(x) == set(y) and all(
        x[k].dtype == y[k].dtype and x[k].shape == y[k].shape
        and np.array_equal(bits(x[k]), bits(y[k])) for k in x)


@st.composite
def tensor_pairs(draw):
    dtype = draw(st.sampled_from(DTYPES))
    width = torch.tensor([], dtype=dtype).element_size()
    shape = tuple(draw(st.lists(st.integers(0, 40), min_size=0, max_size=3)))
    n = int(np.prod(shape)) if shape else 1
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    special = np.array(SPECIAL[width], dtype=np.uint64)
    base = _from_bits(rng.integers(0, 2 ** (8 * width), n, dtype=np.uint64), dtype, shape)
    if draw(st.booleans()):
        base = (torch.randn(shape, generator=torch.Generator().manual_seed(int(rng.integers(99))))
                * 0.02).to(dtype)
    old = bits(base.contiguous()).astype(np.uint64)
    old_mask = rng.random(n) < draw(st.floats(0, 0.3))
    old[old_mask] = rng.choice(special, int(old_mask.sum()))
    density = draw(st.sampled_from([0.0, 0.001, 0.01, 0.03, 0.2, 0.5, 0.9, 1.0]))
    mask = rng.random(n) < density
    kind = draw(st.sampled_from(["ulp", "small", "random", "special", "sign"]))
    new = old.copy()
    m = int(mask.sum())
    mod = 2 ** (8 * width)
    if kind == "ulp":
        new[mask] = (old[mask] + rng.choice([1, mod - 1], m).astype(np.uint64)) % mod
    elif kind == "small":
        new[mask] = (old[mask] + rng.integers(-300, 300, m).astype(np.int64).astype(np.uint64)) % mod
    elif kind == "random":
        new[mask] = rng.integers(0, mod, m, dtype=np.uint64)
    elif kind == "special":
        new[mask] = rng.choice(special, m)
    else:
        new[mask] = old[mask] ^ np.uint64(1 << (8 * width - 1))
    return {"w": _from_bits(old, dtype, shape)}, {"w": _from_bits(new, dtype, shape)}


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tensor_pairs())
def test_delta_round_trip_is_bit_exact(pair):
    old, new = pair
    payload = seal(DeltaCodec().encode(old, new))
    wire = from_buffer(to_bytes(payload))
    verify_body(wire)
    assert _same_bits(DeltaCodec().decode(old, wire), new)
    assert _same_bits(old, pair[0])  # decode does not touch its input


@settings(max_examples=100, deadline=None)
@given(tensor_pairs())
def test_full_round_trip_is_bit_exact(pair):
    _, new = pair
    payload = from_buffer(to_bytes(seal(FullCodec().encode(None, new))))
    assert _same_bits(FullCodec().decode(None, payload), new)
    assert state_hash(FullCodec().decode(None, payload)) == state_hash(new)


def test_many_tensors_and_other_dtypes():
    g = torch.Generator().manual_seed(0)
    old = {"a": torch.randn(300, 7, generator=g).bfloat16(), "b": torch.randn(5, generator=g),
           "ids": torch.arange(10), "flag": torch.tensor([True, False]),
           "e": torch.empty(0, 3).half(), "s": torch.tensor(1.5)}
    new = {k: v.clone() for k, v in old.items()}
    new["a"][3, 4] = float("nan")
    new["b"][0] = -0.0
    new["ids"][2] = -7
    new["flag"][1] = True
    new["s"] = torch.tensor(float("inf"))
    p = from_buffer(to_bytes(seal(DeltaCodec().encode(old, new))))
    assert _same_bits(apply({k: v.clone() for k, v in old.items()}, p), new)


def test_method_choice_by_density():
    g = torch.Generator().manual_seed(1)
    old = torch.randn(20000, generator=g).bfloat16()
    sparse = old.clone()
    sparse[::100] = (sparse[::100].float() * 1.004).bfloat16()
    dense = torch.randn(20000, generator=g).bfloat16()
    p = DeltaCodec().encode({"s": old, "d": old, "z": old}, {"s": sparse, "d": dense, "z": old})
    methods = {e.name: e.method for e in p.header.tensors}
    assert methods == {"s": "sparse", "d": "raw", "z": "same"}
    assert p.nbytes < 20000 * 2 + 200 * 2  # the dense tensor raw, ~2 bytes per sparse change


def test_corrupt_streams_raise_integrity_errors():
    old = {"w": torch.zeros(5000, dtype=torch.bfloat16)}
    new = {"w": old["w"].clone()}
    new["w"][::37] = 1.0
    wire = bytearray(to_bytes(seal(DeltaCodec().encode(old, new))))
    wire[-40] ^= 0x10
    with pytest.raises(IntegrityError):
        verify_body(from_buffer(wire))
    wire2 = bytearray(to_bytes(seal(DeltaCodec().encode(old, new))))
    wire2[30] ^= 0x01  # inside the header
    with pytest.raises(IntegrityError):
        from_buffer(wire2)


@given(st.lists(st.integers(0, 2**40), max_size=300), st.integers(0, 20))
def test_rice_round_trip(values, k):
    v = np.array(values, dtype=np.uint64)
    unary, low, esc, _ = entropy.rice_encode(v, k)
    assert np.array_equal(entropy.rice_decode(unary, low, esc, v.size, k), v)


@given(st.lists(st.integers(-(2**62), 2**62), max_size=200))
def test_zigzag_and_keys(values):
    d = np.array(values, dtype=np.int64)
    assert np.array_equal(entropy.unzigzag(entropy.zigzag(d)), d)
    x = np.array([abs(v) % 65536 for v in values], dtype=np.uint16)
    assert np.array_equal(entropy.float_unkey(entropy.float_key(x)), x)


def test_float_key_is_order_preserving():
    x = torch.tensor([-float("inf"), -2.0, -1e-40, -0.0, 0.0, 1e-40, 1.0, float("inf")])
    k = entropy.float_key(bits(x))
    assert np.all(np.diff(k.astype(np.int64)) > 0)


def test_changed_positions_matches_naive():
    rng = np.random.default_rng(0)
    a = rng.integers(0, 65535, 100003, dtype=np.uint16)
    b = a.copy()
    idx = rng.choice(a.size, 999, replace=False)
    b[idx] ^= 1
    assert np.array_equal(changed_positions(a, b), np.sort(idx))
    a4, b4 = a[:100000], b[:100000]
    assert np.array_equal(changed_positions(a4, b4), np.flatnonzero(a4 != b4))


@given(st.lists(st.integers(0, 2**64 - 1), max_size=300))
def test_class_coding_round_trip(values):
    v = np.array(values, dtype=np.uint64)
    classes, mantissa = entropy.class_encode(v)
    assert np.array_equal(entropy.class_decode(classes, mantissa), v)
