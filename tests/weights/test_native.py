"""The C kernels (weights/_native.c via native.py) give the bits of their NumPy versions, and
payloads coded with either decode with the other. Under CI the kernels must be built (setup.sh
installs with a C compiler), so these compare instead of skipping."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import zstandard
from prereq import missing

from traingym.weights import entropy, extract, lthash, native, tiered
from traingym.weights.codecs import DeltaCodec, apply_changes
from traingym.weights.hashing import bits, state_hash

UINTS = [np.uint8, np.uint16, np.uint32, np.uint64]


@pytest.fixture
def lib():
    if native.lib is None:
        missing("the C kernels are not built (traingym/weights/_native.c; pip install -e . "
                "with a C compiler builds them)")
    return native.lib


@pytest.fixture
def numpy_only(monkeypatch):
    """The codec with its NumPy code (as without a C compiler)."""
    monkeypatch.setattr(native, "lib", None)


def _pair(rng, dtype, n, density):
    a = rng.integers(0, np.iinfo(dtype).max, n, dtype=dtype, endpoint=True)
    b = a.copy()
    k = int(n * density)
    pos = rng.choice(n, k, replace=False) if k else np.zeros(0, np.int64)
    b[pos] ^= rng.integers(1, np.iinfo(dtype).max, k, dtype=dtype, endpoint=True)
    return a, b


@pytest.mark.parametrize("n,density", [(0, 0), (5, 1.0), (4099, 0.01), (70_001, 0.02),
                                       (70_001, 0.5)])
def test_bf16_changes_match_torchs_casts(lib, n, density):
    """Values near rounding ties, subnormals, infinities and the largest finite ones included."""
    rng = np.random.default_rng(n)
    a = (rng.standard_normal(n) * 0.02).astype(np.float32)
    special = np.array([0.0, -0.0, np.inf, -np.inf, 3.4e38, -3.4e38, 1e-40, -1e-42,
                        1.0 + 2**-8, 1.0 + 3 * 2**-8, 1.0 + 2**-8 + 2**-20], np.float32)
    a[: min(n, special.size)] = special[: min(n, special.size)]
    b = a.copy()
    k = int(n * density)
    pos = rng.choice(n, k, replace=False) if k else np.zeros(0, np.int64)
    b[pos] += (rng.standard_normal(k) * 1e-4).astype(np.float32)
    ta, tb = (torch.from_numpy(x).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
              for x in (a, b))
    want = np.flatnonzero(ta != tb)
    for lo in (0, 3):
        got = native.bf16_changes(a[lo:], b[lo:])
        w = want[want >= lo]
        np.testing.assert_array_equal(got[0], w - lo)
        np.testing.assert_array_equal(got[1], ta[w])
        np.testing.assert_array_equal(got[2], tb[w])
    if n:
        b[n // 2] = np.nan
        assert native.bf16_changes(a, b) is None


@pytest.mark.parametrize("dtype", UINTS)
@pytest.mark.parametrize("n,density", [(0, 0), (7, 0.5), (1000, 0), (4099, 0.01), (4099, 1.0),
                                       (70_001, 0.003), (70_001, 0.3)])
def test_changes_match_numpy(lib, monkeypatch, dtype, n, density):
    rng = np.random.default_rng(n)
    a, b = _pair(rng, dtype, n, density)
    for lo in (0, 3):  # an unaligned slice too (a piece of a tensor)
        got = native.changes(a[lo:], b[lo:])
        want_pos = np.flatnonzero(a[lo:] != b[lo:])
        np.testing.assert_array_equal(got[0], want_pos)
        np.testing.assert_array_equal(got[1], a[lo:][want_pos])
        np.testing.assert_array_equal(got[2], b[lo:][want_pos])
        assert got[1].dtype == a.dtype and got[0].dtype == np.int64
        with monkeypatch.context() as m:
            m.setattr(native, "lib", None)
            ref = extract.changes(a[lo:], b[lo:])
        for x, y in zip(got, ref):
            np.testing.assert_array_equal(x, y)


def test_changes_grow_past_the_first_guess(lib):
    """Outputs start at 1/16 of the array; a dense run past that continues in new parts."""
    a = np.zeros(200_000, np.uint16)
    b = a.copy()
    b[150_000:] = 1  # nothing at first, then everything
    pos, va, vb = native.changes(a, b)
    np.testing.assert_array_equal(pos, np.arange(150_000, 200_000))
    assert (va == 0).all() and (vb == 1).all()


@pytest.mark.parametrize("dtype,mbits", [(np.uint16, 7), (np.uint32, 23), (np.uint64, 52)])
def test_small_positions_match_numpy(lib, monkeypatch, dtype, mbits):
    rng = np.random.default_rng(1)
    a = rng.integers(0, np.iinfo(dtype).max, 1_300_001, dtype=dtype, endpoint=True)
    for e in (0, 1, 60, 120, 127, 200):
        bound = e << mbits
        got = native.small_positions(a, bound)
        with monkeypatch.context() as m:
            m.setattr(native, "lib", None)
            want = tiered.small_positions(a, bound)
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("dtype", UINTS)
@pytest.mark.parametrize("numel", [100_000, 1 << 33])  # packed words, and mixed positions
def test_change_sum_matches_numpy(lib, monkeypatch, dtype, numel):
    rng = np.random.default_rng(2)
    n = 40_000
    pos = np.sort(rng.choice(min(numel, 1 << 40), n, replace=False)).astype(np.int64)
    old, new = _pair(rng, dtype, n, 1.0)
    got = lthash.change_sum("w", numel, pos, old, new)
    with monkeypatch.context() as m:
        m.setattr(native, "lib", None)
        want = lthash.change_sum("w", numel, pos, old, new)
    np.testing.assert_array_equal(got, want)
    assert got.dtype == np.uint64 and got.shape == (lthash.LANES,)


@pytest.mark.parametrize("k", [0, 1, 5, 13, 31, 40, 57, 63])
def test_rice_matches_numpy(lib, monkeypatch, k):
    rng = np.random.default_rng(k)
    v = rng.geometric(1 / (1 + 2.0**k), 5001).astype(np.uint64) - np.uint64(1)
    v[::97] = rng.integers(0, 2**63, v[::97].size, dtype=np.uint64)  # escapes
    v[1] = 0
    got = entropy.rice_encode(v, k)
    with monkeypatch.context() as m:
        m.setattr(native, "lib", None)
        want = entropy.rice_encode(v, k)
        np.testing.assert_array_equal(entropy.rice_decode(*got[:3], v.size, k), v)
    assert got == want
    np.testing.assert_array_equal(entropy.rice_decode(*want[:3], v.size, k), v)
    assert entropy.rice_encode(v[:0], k)[:3] == (b"", b"", b"")


def test_rice_decode_refuses_bad_streams(lib):
    v = np.arange(100, dtype=np.uint64) * np.uint64(37)
    unary, low, esc, _ = entropy.rice_encode(v, 3)
    with pytest.raises(ValueError, match="unary stream too short"):
        entropy.rice_decode(unary[:-4], low, esc, v.size, 3)
    with pytest.raises(ValueError, match="fixed-width stream too short"):
        entropy.rice_decode(unary, low[:-8], esc, v.size, 3)
    with pytest.raises(ValueError, match="escape stream"):
        entropy.rice_decode(unary, low, esc + bytes(8), v.size, 3)
    with pytest.raises(ValueError, match="unary run longer"):
        entropy.rice_decode(bytes(64) + b"\xff", low, esc, v.size, 3)


MBITS = {np.uint16: 7, np.uint32: 23, np.uint64: 52}
FLOATS = {np.uint16: "bfloat16", np.uint32: "float32", np.uint64: "float64"}


def _tiered_case(rng, dtype, n):
    """Old and new float bits where the small weights change often and the others rarely,
    across zero and by many ulps too; a threshold and S from tiered.plan (or forced)."""
    x = rng.standard_normal(n) * np.where(rng.random(n) < 0.1, 1e-5, 1e-1)
    a = torch.from_numpy(x).to(getattr(torch, FLOATS[dtype])).view(
        {np.uint16: torch.int16, np.uint32: torch.int32, np.uint64: torch.int64}[dtype]
    ).numpy().view(dtype)
    mbits = MBITS[dtype]
    small = tiered.exponents(a, mbits) < np.median(tiered.exponents(a, mbits)) - 8
    moved = small & (rng.random(n) < 0.8) | (rng.random(n) < 0.01)
    b = a.copy()
    steps = rng.integers(1, 40, n).astype(dtype) * np.where(rng.random(n) < 0.5, 1, -1).astype(dtype)
    b[moved] = entropy.float_unkey(entropy.float_key(a[moved]) + steps[moved])
    b[0], a[0] = dtype(1) << dtype(8 * a.itemsize - 1), dtype(1)  # +tiny -> -0.0 across zero
    pos = np.flatnonzero(a != b)
    e_pos = tiered.exponents(a[pos], mbits)
    threshold, S = tiered.plan(a, e_pos, mbits)
    if not threshold:
        threshold = int(np.median(e_pos)) + 1
        S = tiered.small_positions(a, threshold << mbits)
    return a, b, pos, e_pos, threshold, S, mbits


@pytest.mark.parametrize("dtype", [np.uint16, np.uint32, np.uint64])
@pytest.mark.parametrize("n", [1, 5000, 200_003])
def test_tiered_split_and_join_match_numpy(lib, monkeypatch, dtype, n):
    """tiered.encode and decode through the C reorderings: the same buffer and params as
    NumPy's, and each side decodes the other's to the same positions and differences."""
    rng = np.random.default_rng(n)
    a, b, pos, e_pos, threshold, S, mbits = _tiered_case(rng, dtype, n)
    zc = zstandard.ZstdCompressor(level=1)
    got = tiered.encode(pos, a[pos], b[pos], e_pos, threshold, S, mbits, zc)
    with monkeypatch.context() as m:
        m.setattr(native, "lib", None)
        want = tiered.encode(pos, a[pos], b[pos], e_pos, threshold, S, mbits, zc)
        dec_n = tiered.decode(a, got[0], pos.size, got[1], mbits)
    assert got[1] == want[1] and got[0] == want[0]
    dec_c = tiered.decode(a, want[0], pos.size, want[1], mbits)
    for p, kd in (dec_c, dec_n):
        order = np.argsort(p)
        np.testing.assert_array_equal(p[order], pos)
        new = entropy.float_unkey(entropy.float_key(a[p]) + kd)
        np.testing.assert_array_equal(new[order], b[pos])
    np.testing.assert_array_equal(dec_c[0], dec_n[0])
    np.testing.assert_array_equal(dec_c[1], dec_n[1])


@pytest.mark.parametrize("dtype", [np.uint16, np.uint32, np.uint64])
def test_no_tier_round_trips_both_ways(lib, monkeypatch, dtype):
    """Threshold 0 (no tier S: every change a plain position in R) codes the same buffer in C
    and NumPy, and each side decodes the other's, without listing anything."""
    rng = np.random.default_rng(7)
    a, b, pos, e_pos, _, _, mbits = _tiered_case(rng, dtype, 50_001)
    zc = zstandard.ZstdCompressor(level=1)
    got = tiered.encode(pos, a[pos], b[pos], e_pos, 0, tiered.NO_TIER, mbits, zc)
    assert got[1][:3] == (0, 0, 0)  # threshold, mode, changes coded in S
    with monkeypatch.context() as m:
        m.setattr(native, "lib", None)
        want = tiered.encode(pos, a[pos], b[pos], e_pos, 0, tiered.NO_TIER, mbits, zc)
        dec_n = tiered.decode(a, got[0], pos.size, got[1], mbits)
    assert got == want
    listed = []
    monkeypatch.setattr(tiered, "small_positions", lambda *x: listed.append(x))
    dec_c = tiered.decode(a, got[0], pos.size, got[1], mbits)
    assert not listed
    for p, kd in (dec_c, dec_n):
        np.testing.assert_array_equal(p, pos)
        np.testing.assert_array_equal(entropy.float_unkey(entropy.float_key(a[p]) + kd), b[pos])


def test_scan_price_turns_the_tier_off(lib, monkeypatch):
    """A tier that saves bits is dropped once its listing passes cost more than the bits it
    saves take on the link, in C and NumPy alike; an unknown link prices them at 0."""
    rng = np.random.default_rng(3)
    a, b, pos, e_pos, _, _, mbits = _tiered_case(rng, np.uint16, 200_003)
    assert tiered.scan_bits(None) == 0.0
    fast, slow = tiered.scan_bits(1 / 10e9), tiered.scan_bits(1 / 1e6)  # 10 GB/s, 1 MB/s
    assert fast > slow > 0 and tiered.scan_bits(1 / 10e9, threads=2) == fast / 2
    for use_c in (True, False):
        with monkeypatch.context() as m:
            if not use_c:
                m.setattr(native, "lib", None)
            assert tiered.plan(a, e_pos, mbits)[0] > 0
            assert tiered.plan(a, e_pos, mbits, slow)[0] > 0
            assert tiered.plan(a, e_pos, mbits, fast) == (0, None)


def test_may_pay_never_skips_a_tier_the_plan_would_pick(lib):
    """may_pay is a bound: where it says no tier can pay, the plan agrees (at every price)."""
    rng = np.random.default_rng(5)
    a, b, pos, e_pos, _, _, mbits = _tiered_case(rng, np.uint16, 200_003)
    for scan in (0.0, 1e-3, 0.01, 0.03, 0.1, 0.3, 1.0, 3.0):
        for e in (e_pos, e_pos[: e_pos.size // 20]):
            if not tiered.may_pay(e.size, a.size, scan):
                assert tiered.plan(a, e, mbits, scan) == (0, None)
    assert tiered.may_pay(pos.size, a.size, 0.0) and not tiered.may_pay(pos.size, a.size, 3.0)


@pytest.mark.parametrize("dtype", [np.uint16, np.uint32, np.uint64])
@pytest.mark.parametrize("n", [1, 5000, 200_003])
def test_plan_matches_numpy(lib, monkeypatch, dtype, n):
    """The same threshold and tier S as tiered.plan's NumPy version (these cases have no
    near-ties), also where no tier pays (uniform changes)."""
    rng = np.random.default_rng(n + 1)
    a, b, pos, e_pos, _, _, mbits = _tiered_case(rng, dtype, n)
    flat = rng.choice(n, max(1, n // 50), replace=False)
    flat.sort()
    for e in (e_pos, tiered.exponents(a[flat], mbits)):
        got = tiered.plan(a, e, mbits)
        with monkeypatch.context() as m:
            m.setattr(native, "lib", None)
            want = tiered.plan(a, e, mbits)
        assert got[0] == want[0]
        if want[0]:
            np.testing.assert_array_equal(got[1], want[1])
        else:
            assert got[1] is None and want[1] is None


def test_tiered_join_refuses_positions_outside_the_base(lib):
    a = np.zeros(100, np.uint16)
    with pytest.raises(ValueError, match="position out of range"):
        native.tiered_join(a, np.arange(100), np.array([100]), np.zeros(0, np.int64),
                           bytes(2), 1, 7)


def _states(seed=0):
    from realistic_weights import rl_states, tiny_llama

    return list(rl_states(tiny_llama(seed=seed), 2, lr=1e-3))


@pytest.mark.parametrize("threads", [1, 3])
def test_payloads_are_the_same_bytes_and_decode_across(lib, monkeypatch, threads):
    """One payload from either side, applied by either, to the target's hash."""
    _, old, new = _states()
    old["counts"] = torch.arange(4096, dtype=torch.int32)
    new["counts"] = old["counts"].clone()
    new["counts"][::7] += 1
    codec = DeltaCodec(threads=threads)
    p_c, ch_c = codec.encode_changes(old, new)
    with monkeypatch.context() as m:
        m.setattr(native, "lib", None)
        p_n, ch_n = codec.encode_changes(old, new)
        base = {k: v.clone() for k, v in old.items()}
        got_n, sum_n = apply_changes(base, p_c, threads)
    assert p_c.header == p_n.header
    assert [bytes(b) for b in p_c.buffers] == [bytes(b) for b in p_n.buffers]
    np.testing.assert_array_equal(ch_c.sum, ch_n.sum)
    base = {k: v.clone() for k, v in old.items()}
    got_c, sum_c = apply_changes(base, p_n, threads)
    assert state_hash(got_c) == state_hash(got_n) == state_hash(new)
    np.testing.assert_array_equal(sum_c.sum, ch_c.sum)
    np.testing.assert_array_equal(sum_n.sum, ch_c.sum)


def test_codec_round_trips_without_the_kernels(numpy_only):
    """The fallback path end to end: encode, apply, hash movement equal on both sides."""
    assert native.lib is None
    _, old, new = _states(seed=1)
    p, ch = DeltaCodec().encode_changes(old, new)
    got, applied = apply_changes({k: v.clone() for k, v in old.items()}, p)
    assert state_hash(got) == state_hash(new)
    np.testing.assert_array_equal(applied.sum, ch.sum)
    np.testing.assert_array_equal(ch.sum, lthash.state_sum(new) - lthash.state_sum(old))
    assert all(bits(got[k]).tobytes() == bits(new[k]).tobytes() for k in new)


@pytest.mark.parametrize("dtype,is_float", [(np.uint16, True), (np.uint32, True),
                                            (np.uint64, True), (np.uint8, False),
                                            (np.uint32, False)])
def test_apply_keys_matches_numpy(lib, monkeypatch, dtype, is_float):
    """The fused decode step: a[pos] moves by kd in key space, and the hash's movement of a
    piece at offset 1000 of a larger tensor, as NumPy computes them."""
    rng = np.random.default_rng(4)
    a = rng.integers(0, np.iinfo(dtype).max, 50_000, dtype=dtype, endpoint=True)
    pos = np.sort(rng.choice(a.size, 3_000, replace=False)).astype(np.int64)
    kd = rng.integers(1, np.iinfo(dtype).max, pos.size, dtype=dtype, endpoint=True)
    want = a.copy()
    old = want[pos]
    key = entropy.float_key if is_float else (lambda x: x)
    unkey = entropy.float_unkey if is_float else (lambda x: x)
    want[pos] = unkey(key(old) + kd)
    numel = a.size + 1000
    with monkeypatch.context() as m:
        m.setattr(native, "lib", None)
        want_sum = lthash.change_sum("t", numel, pos + 1000, old, want[pos])
    keys = lthash.tensor_keys("t")
    got_sum = native.apply_keys(a, pos, kd, is_float, keys, lthash.packs(a.itemsize, numel), 1000)
    np.testing.assert_array_equal(a, want)
    np.testing.assert_array_equal(got_sum, want_sum)
    before = a.copy()
    with pytest.raises(ValueError, match="position out of range"):
        native.apply_keys(a, np.array([5, a.size], np.int64), kd[:2], is_float, keys, True, 0)
    np.testing.assert_array_equal(a, before)  # nothing written


def test_tiered_join_and_decode_refuse_bad_ranks_and_thresholds(lib):
    """Ranks a corrupt stream could carry (negative, past the end, unsorted) and thresholds
    out of range are refused before any output, as a ValueError (IntegrityError upstream)."""
    a = np.zeros(100, np.uint16)  # every exponent 0: S (T=1) holds all 100
    S = np.arange(50, dtype=np.int64)  # as if only 50 were small
    for r in ([-1], [50], [3, 3], [5, 2]):
        with pytest.raises(ValueError, match="rank out of range"):
            native.tiered_join(a, S, np.zeros(0, np.int64), np.array(r, np.int64), bytes(8), 1, 7)
    for t in (257, -3):
        with pytest.raises(ValueError, match="threshold"):
            native.tiered_join(a, S, np.zeros(0, np.int64), np.zeros(0, np.int64), b"", t, 7)
        with pytest.raises(ValueError, match="threshold"):
            native.tiered_split(S, np.zeros(0, np.int64), a[:0], a[:0], t, 7)
    with pytest.raises(ValueError, match="threshold 0"):  # no tier, yet an S
        native.tiered_join(a, S, np.zeros(0, np.int64), np.zeros(0, np.int64), b"", 0, 7)
    with pytest.raises(ValueError, match="threshold 0"):
        native.tiered_split(S, np.zeros(0, np.int64), a[:0], a[:0], 0, 7)
    unary, low, esc, _ = entropy.rice_encode(np.array([2**64 - 2, 5], np.uint64), 0)
    with pytest.raises(ValueError, match="rank out of range"):
        tiered._unrice(unary, low, esc, 2, 0, 100)  # the first gap wraps the sum
