"""Codec round trips: every dtype the codec claims, any shape, densities 0..100%, special
values (NaN payloads, infinities, -0.0, subnormals), and the wire format; the "tiered"
method on updates whose small weights change more often; the bit packers."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from traingym.weights import entropy, tiered
from traingym.weights.base import CastView, IntegrityError, Payload
from traingym.weights.codecs import DeltaCodec, FullCodec, apply
from traingym.weights.extract import changed_positions, changes
from traingym.weights.frame import from_buffer, seal, to_bytes, verify_body
from traingym.weights.hashing import bits, raw_state_hash, state_hash

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


def test_full_payload_state_hash_and_cast_copies():
    """The full codec copies the state's own tensors (a later step must not change the
    payload) but not a CastView's fresh casts, and its payload's state hash
    (raw_state_hash, what the publisher names an anchor by) is state_hash of what it holds."""
    g = torch.Generator().manual_seed(0)
    state = {"w": torch.randn(64, 33, generator=g), "b": torch.randn(7, generator=g),
             "h": torch.randn(5, generator=g).bfloat16(), "s": torch.tensor(3.5)}
    view = CastView(state, torch.bfloat16)
    payload = FullCodec().encode(None, view)
    cast = {k: v.to(torch.bfloat16) for k, v in state.items()}
    assert raw_state_hash(payload.header.tensors, payload.buffers) == state_hash(cast)
    before = {k: v.clone() for k, v in state.items()}
    for t in state.values():  # the trainer's next step: no payload byte may follow it
        t.add_(1)
    assert _same_bits(FullCodec().decode(None, payload), {k: v.to(torch.bfloat16)
                                                         for k, v in before.items()})
    live = FullCodec().encode(None, state)  # no cast: copies, so later writes stay out
    want = state_hash(state)
    for t in state.values():
        t.add_(1)
    assert raw_state_hash(live.header.tensors, live.buffers) == want
    delta = DeltaCodec().encode(cast, {k: v.to(torch.bfloat16) for k, v in state.items()})
    with pytest.raises(ValueError, match="not whole raw"):
        raw_state_hash(delta.header.tensors, delta.buffers)


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
    ids = torch.arange(20000)
    moved = ids.clone()
    moved[::100] += 3
    p = DeltaCodec().encode({"s": old, "d": old, "z": old, "i": ids},
                            {"s": sparse, "d": dense, "z": old, "i": moved})
    methods = {e.name: e.method for e in p.header.tensors}
    assert methods == {"s": "tiered", "d": "raw", "z": "same", "i": "sparse"}
    assert p.nbytes < 20000 * 2 + 200 * 2 + 200 * 2  # dense raw, ~2 bytes per sparse change


def test_corrupt_streams_raise_integrity_errors():
    old = {"w": torch.zeros(5000, dtype=torch.bfloat16)}
    new = {"w": old["w"].clone()}
    new["w"][::37] = 1.0
    payload = seal(DeltaCodec().encode(old, new))
    wire = bytearray(to_bytes(payload))
    wire[len(wire) - (-payload.buffers[-1].nbytes % 64) - 10] ^= 0x10  # in the last buffer
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
    for dt in (np.uint8, np.uint32, np.uint64):  # 8, 2 and 1 lanes per word
        x = rng.integers(0, 200, 40000).astype(dt)
        y = x.copy()
        y[rng.choice(x.size, 500, replace=False)] += dt(1)
        pos, x_pos, y_pos = changes(x, y)
        assert np.array_equal(pos, np.flatnonzero(x != y))
        assert np.array_equal(x_pos, x[pos]) and np.array_equal(y_pos, y[pos])


@given(st.lists(st.integers(0, 2**64 - 1), max_size=300))
def test_class_coding_round_trip(values):
    v = np.array(values, dtype=np.uint64)
    classes, mantissa = entropy.class_encode(v)
    assert np.array_equal(entropy.class_decode(classes, mantissa), v)


# ---------------------------------------------------------------- the "tiered" method
WIDE_DTYPES = [torch.bfloat16, torch.float16, torch.float32, torch.float64]
_UINT = {2: np.uint16, 4: np.uint32, 8: np.uint64}


@st.composite
def rl_like_pairs(draw):
    """Bases with a share of tiny magnitudes (and zeros, subnormals, NaNs, infinities) whose
    elements change far more often than the rest: the structure "tiered" is for."""
    dtype = draw(st.sampled_from(WIDE_DTYPES))
    width = torch.tensor([], dtype=dtype).element_size()
    n = draw(st.integers(1, 6000))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    g = torch.Generator().manual_seed(int(rng.integers(2**31)))
    tiny = torch.rand(n, generator=g) < draw(st.sampled_from([0.01, 0.05, 0.3]))
    base = torch.randn(n, generator=g, dtype=torch.float64) * torch.where(tiny, 1e-5, 0.02)
    old = bits(base.to(dtype)).astype(np.uint64)
    if width in SPECIAL:
        special = np.array(SPECIAL[width], dtype=np.uint64)
        spots = rng.random(n) < 0.02
        old[spots] = rng.choice(special, int(spots.sum()))
    p_tiny = draw(st.sampled_from([0.3, 0.7, 0.97, 1.0]))
    p_rest = draw(st.sampled_from([0.0, 0.001, 0.01]))
    mask = rng.random(n) < np.where(tiny.numpy(), p_tiny, p_rest)
    m, wrap = int(mask.sum()), np.uint64(2 ** (8 * width) - 1)  # uint64 sums wrap, then mask
    kind = draw(st.sampled_from(["ulp", "small", "random", "sign"]))
    new = old.copy()
    if kind == "ulp":
        new[mask] = (old[mask] + rng.choice([1, -1], m).astype(np.int64).astype(np.uint64)) & wrap
    elif kind == "small":
        step = rng.integers(1, 300, m) * rng.choice([1, -1], m)
        new[mask] = (old[mask] + step.astype(np.int64).astype(np.uint64)) & wrap
    elif kind == "random":
        new[mask] = rng.integers(0, 2**63, m, dtype=np.uint64) * np.uint64(2) & wrap
    else:
        new[mask] = old[mask] ^ np.uint64(1 << (8 * width - 1))
    t = _UINT[width]
    as_t = lambda x: torch.from_numpy(x.astype(t).view(f"i{width}")).view(dtype)  # noqa: E731
    return {"w": as_t(old)}, {"w": as_t(new)}


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rl_like_pairs())
def test_tiered_round_trip_is_bit_exact(pair):
    old, new = pair
    payload = seal(DeltaCodec().encode(old, new))
    wire = from_buffer(to_bytes(payload))
    verify_body(wire)
    assert _same_bits(DeltaCodec().decode(old, wire), new)


def _rl_like(dtype, n=200_000, p_tiny=0.98, p_rest=0.004, seed=0):
    g = torch.Generator().manual_seed(seed)
    tiny = torch.rand(n, generator=g) < 0.01
    base = (torch.randn(n, generator=g) * torch.where(tiny, 1e-5, 0.02)).to(dtype)
    p = torch.where(tiny, p_tiny, p_rest)
    changed = torch.rand(n, generator=g) < p
    step = torch.where(tiny, 3e-5, 2e-4) * torch.randn(n, generator=g)
    new = torch.where(changed, (base.double() + step).to(dtype), base)
    return {"w": base}, {"w": new}


@pytest.mark.parametrize("dtype", WIDE_DTYPES)
@pytest.mark.parametrize("p_tiny,mode,gain", [(0.98, 1, 0.9), (0.3, 0, 1.0)])
def test_tiered_is_chosen_and_beats_sparse(dtype, p_tiny, mode, gain, monkeypatch):
    old, new = _rl_like(dtype, p_tiny=p_tiny)
    p = DeltaCodec().encode(old, new)
    (e,) = p.header.tensors
    assert e.method == "tiered" and e.params[1] == mode  # mode 1 codes S's unchanged elements
    assert _same_bits(apply({"w": old["w"].clone()}, from_buffer(to_bytes(seal(p)))), new)
    monkeypatch.setattr(tiered, "MANTISSA_BITS", {})  # what "sparse" alone would send
    sparse = DeltaCodec().encode(old, new)
    assert sparse.header.tensors[0].method == "sparse"
    assert p.nbytes < gain * sparse.nbytes


def test_tiered_skipped_without_a_magnitude_effect():
    g = torch.Generator().manual_seed(3)
    old = (torch.randn(100_000, generator=g) * 0.02).bfloat16()
    new = old.clone()
    idx = torch.randperm(old.numel(), generator=g)[:1000]
    new[idx] = (new[idx].float() * 1.01).bfloat16()
    (e,) = DeltaCodec().encode({"w": old}, {"w": new}).header.tensors
    assert e.method == "tiered" and e.params[0] == 0  # threshold 0: no tier


def test_a_fast_link_drops_the_tier():
    """The same update with a tier on a slow (or unknown) link and without one on a fast
    link, where the bytes it saves take less time than its passes; both decode."""
    old, new = _rl_like(torch.bfloat16, p_tiny=0.3)
    sent = {}
    for link in (None, 1 / 1e6, 1 / 10e9):  # unknown, 1 MB/s, 10 GB/s
        p, _ = DeltaCodec().encode_changes(old, new, link_s_per_byte=link)
        (e,) = p.header.tensors
        assert _same_bits(apply({"w": old["w"].clone()}, from_buffer(to_bytes(seal(p)))), new)
        sent[link] = (e.params[0] > 0, p.nbytes)
    assert sent[None][0] and sent[1 / 1e6][0] and not sent[1 / 10e9][0]
    assert sent[1 / 10e9][1] > sent[None][1]  # more bytes, fewer passes


def test_tiered_corrupt_params_raise_integrity_errors():
    old, new = _rl_like(torch.bfloat16, n=20_000)
    p = DeltaCodec().encode(old, new)
    (e,) = p.header.tensors
    assert e.method == "tiered"
    bad = [(e.params[0] + 300, *e.params[1:]), (e.params[0], 2, *e.params[2:]),
           (*e.params[:2], e.params[2] + 10**6, *e.params[3:]), e.params[:-1],
           (*e.params[:3], 70, *e.params[4:]), (*e.params[:-1], e.params[-1] + 10**6)]
    for params in bad:
        header = dataclasses.replace(p.header, tensors=(dataclasses.replace(e, params=params),))
        with pytest.raises(IntegrityError):
            apply({"w": old["w"].clone()}, Payload(header, p.buffers))


def test_tiered_on_a_real_rl_stream():
    """A tiny Llama under AdamW (bf16 export): the tier is used and shrinks the update."""
    from realistic_weights import rl_states, tiny_llama

    states = list(rl_states(tiny_llama(hidden=64, layers=2), steps=2, lr=1e-5, batch=2, seq=16))
    old, new = states[1], states[2]
    p = DeltaCodec().encode(old, new)
    methods = [e.method for e in p.header.tensors]
    assert methods.count("tiered") >= 3
    assert _same_bits(apply({k: v.clone() for k, v in old.items()}, p), new)


def test_small_positions_matches_naive(monkeypatch):
    monkeypatch.setattr(tiered, "CHUNK", 1000)  # several chunks and a ragged last one
    rng = np.random.default_rng(0)
    for dt in (np.uint16, np.uint32, np.uint64):
        a = rng.integers(0, np.iinfo(dt).max, 4321, dtype=dt, endpoint=True)
        mag = np.iinfo(dt).max >> 1
        for bound in (0, 1, int(mag) // 3, int(mag) + 1):
            naive = np.flatnonzero((a & mag) < bound)
            assert np.array_equal(tiered.small_positions(a, bound), naive)


def _pack_reference(v: np.ndarray, lengths: np.ndarray) -> bytes:
    bitstr = "".join(format(int(x), f"0{int(n)}b")[-int(n):] if n else ""
                     for x, n in zip(v, lengths))
    bitstr += "0" * (-len(bitstr) % 8)
    return bytes(int(bitstr[i : i + 8], 2) for i in range(0, len(bitstr), 8))


@given(st.lists(st.integers(0, 2**64 - 1), max_size=200), st.integers(1, 64))
def test_pack_fixed_matches_reference(values, k):
    v = np.array(values, dtype=np.uint64)
    packed = entropy.pack_fixed(v, k)
    assert packed == _pack_reference(v & np.uint64(2**64 - 1 >> (64 - k)), np.full(v.size, k))
    assert np.array_equal(entropy.unpack_fixed(packed, k, v.size),
                          v & np.uint64(2**64 - 1 >> (64 - k)))


@given(st.lists(st.tuples(st.integers(0, 2**64 - 1), st.integers(0, 64)), max_size=200))
def test_pack_bits_matches_reference(fields):
    lengths = np.array([n for _, n in fields], dtype=np.uint8)
    v = np.array([x & ((1 << n) - 1) for x, n in fields], dtype=np.uint64)
    packed = entropy.pack_bits(v, lengths)
    assert packed == _pack_reference(v, lengths)
    assert np.array_equal(entropy.unpack_bits(packed, lengths), v)


@pytest.mark.parametrize("mean", [0.2, 3, 40, 900, 50_000])
def test_best_k_is_near_the_best_rice_parameter(mean):
    v = np.random.default_rng(1).geometric(1 / (mean + 1), 50_000).astype(np.uint64) - np.uint64(1)
    costs = [entropy.rice_cost(v, k) for k in range(40)]
    assert entropy.rice_cost(v, entropy.best_k(v)) <= 1.01 * min(costs)


@given(st.integers(0, 5000), st.sampled_from([0.0, 0.001, 0.05, 0.5, 1.0]), st.integers(0, 99))
def test_flatnonzero_sparse_matches_numpy(n, density, seed):
    m = (np.random.default_rng(seed).random(n + 3) < density)[3:]  # not 8-byte aligned
    assert np.array_equal(tiered.flatnonzero_sparse(m), np.flatnonzero(m))
