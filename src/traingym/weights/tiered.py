"""The delta codec's "tiered" method: sparse float changes coded given the receiver's base.

In a low-precision RL update most weights change only when their fp32 master crosses a rounding
boundary, but the smallest have an ulp below the step and change on nearly every step; given the old
exponent, which the receiver holds, which elements changed costs far fewer bits
(benchmarks/delta_context.py). So:
- Tier S: elements whose old magnitude is below a per-tensor exponent threshold; both sides
  list S in one pass over the base (`small_positions`); the encoder sends which of S changed
  (or which did not, if fewer) as gap-coded ranks in S.
- Tier R (the rest): changed positions as gap-coded ranks among elements not in S.
- Values: key differences (as "sparse"), zigzagged, S's ordered by old exponent so zstd's
  per-block tables see one exponent at a time; byte planes in one zstd frame.
- Threshold 0 is no tier (no pass over the base), chosen where no tier saves MIN_GAIN or the
  link is fast enough that the saved bits cost less time than the listing passes (`scan_bits`).
Not covered: non-float dtypes and float formats outside MANTISSA_BITS ("sparse" codes them).
"""

from __future__ import annotations

import math

import numpy as np
import torch
import zstandard

from traingym.weights import entropy, native

MANTISSA_BITS = {torch.bfloat16: 7, torch.float16: 10, torch.float32: 23, torch.float64: 52}
SAMPLE = 1 << 10  # elements sampled per tensor to estimate the exponent histogram
CHUNK = 1 << 19  # elements per step of the pass over the base (stays in cache)
MIN_GAIN = 0.02  # a tier must save this fraction of the estimated position bits
# Each element of S costs both sides time whether it changed or not, so the threshold's cost
# counts it at S_PRICE bits: S holds only elements that nearly always change (on a first AdamW
# step, where most weights move one ulp, the tier does not list most of the model).
S_PRICE = 0.1
# Both sides' extra time per element of a tensor coded with a tier rather than without
# (threshold 0), one thread each
# (benchmarks/results/weight_sync_scaling/2026-12-04-ebadce1-notier.json).
LIST_S = 0.65e-9
NO_TIER = np.empty(0, np.int64)  # S under threshold 0: no tier, every change in R
NO_TIER.flags.writeable = False


def _mag_mask(a: np.ndarray):
    return a.dtype.type(np.iinfo(a.dtype).max >> 1)


def exponents(x: np.ndarray, mbits: int) -> np.ndarray:
    """The exponent field of float bit patterns (same unsigned dtype)."""
    return (x & _mag_mask(x)) >> x.dtype.type(mbits)


def flatnonzero_sparse(m: np.ndarray) -> np.ndarray:
    """np.flatnonzero for a mostly False bool array, faster than it when few are True: the
    nonzero 8-byte words first, then the lanes within them."""
    n8 = m.size & ~7
    if n8 < 512:
        return np.flatnonzero(m)
    w64 = m[:n8].view(np.uint64)
    words = np.flatnonzero(w64 != 0)
    lanes = np.flatnonzero(w64[words].view(bool))
    idx = (words[lanes >> 3] << 3) | (lanes & 7)
    return idx if n8 == m.size else np.concatenate([idx, np.flatnonzero(m[n8:]) + n8])


def small_positions(a: np.ndarray, bound: int) -> np.ndarray:
    """Sorted indices of the elements whose magnitude bits are below `bound`: one pass over
    `a`, in cache-sized chunks with reused temporaries (with the C kernels, one loop)."""
    if native.lib is not None:
        return native.small_positions(a, bound)
    mag, bound = _mag_mask(a), a.dtype.type(bound)
    if a.size <= CHUNK:
        return flatnonzero_sparse((a & mag) < bound)
    tmp, hit, out = np.empty(CHUNK, a.dtype), np.empty(CHUNK, bool), []
    for i in range(0, a.size, CHUNK):
        x = a[i : i + CHUNK]
        np.bitwise_and(x, mag, out=tmp[: x.size])
        np.less(tmp[: x.size], bound, out=hit[: x.size])
        out.append(flatnonzero_sparse(hit[: x.size]) + i)
    return np.concatenate(out)


def _counts_ok(x: np.ndarray) -> np.ndarray:
    return x.astype(np.int64) if x.dtype.itemsize == 8 else x  # bincount refuses uint64


_SIGNS = np.array([1.0, -1.0, -1.0, 1.0, -1.0, -1.0])


def _xlog(x: np.ndarray) -> np.ndarray:
    return x * np.log2(np.maximum(x, 1.0))  # 0 for x <= 1: counts, or estimates of them


def _cost(s: np.ndarray, hs: np.ndarray, big_n: float, n: float, scan: float) -> np.ndarray:
    """Zeroth-order position bits for each threshold T, given the element counts s[T] and
    changed counts hs[T] below it (m*H(k/m) for each tier, as m log m - k log k - (m-k) log
    (m-k)), plus S_PRICE per element of S, plus `scan` per element of the tensor for T > 0."""
    r, hr = np.maximum(big_n - s, 0.0), n - hs
    terms = _xlog(np.stack([s, hs, s - hs, r, hr, r - hr]))  # one call: these are short
    return _SIGNS @ terms + S_PRICE * s + np.where(np.arange(s.size) > 0, scan * big_n, 0.0)


def scan_bits(link_s_per_byte: float | None, threads: int = 1) -> float:
    """What listing S costs, in bits per element of the tensor, on a link that moves a byte
    in `link_s_per_byte` seconds (both sides' LIST_S of work, split over `threads`, against
    the link time the same bits would take). 0 when the link is unknown: bytes first."""
    if not link_s_per_byte:
        return 0.0
    return 8 * LIST_S / (max(threads, 1) * link_s_per_byte)


def may_pay(n: int, size: int, scan: float) -> bool:
    """Whether any tier could save MIN_GAIN for n changes in `size` elements once its passes
    cost `scan` bits per element: a tier costs at least that, and no tier costs the
    positions' zeroth-order bits (`_cost` at T = 0). False spares plan's sample and counts."""
    if scan <= 0:
        return True
    no_tier = _xlog1(size) - _xlog1(n) - _xlog1(size - n)
    return scan * size < (1 - MIN_GAIN) * no_tier


def _xlog1(v: float) -> float:
    return v * math.log2(v) if v > 1 else 0.0  # _xlog for one number


def plan(a: np.ndarray, e_changed: np.ndarray, mbits: int,
         scan: float = 0.0) -> tuple[int, np.ndarray | None]:
    """-> (T, S): the exponent threshold with the lowest estimated position cost and the sorted
    positions below it; (0, None) when no tier saves MIN_GAIN. Changed elements are counted
    exactly, the rest from a strided sample, and S's exact counts may then lower T (a sample
    misjudges a large tensor's rare small exponents). `scan` (scan_bits) charges a tier for its
    listing passes."""
    if native.lib is not None:
        return native.plan(a, e_changed, mbits, SAMPLE, S_PRICE, scan, MIN_GAIN)
    n_e = 1 << (8 * a.itemsize - 1 - mbits)
    hit = np.bincount(_counts_ok(e_changed), minlength=n_e).astype(np.float64)
    hs = np.concatenate([[0.0], np.cumsum(hit)])  # hs[T]: changed elements with exponent < T
    n, big_n = float(e_changed.size), float(a.size)
    sample = exponents(a[:: max(1, a.size // SAMPLE)], mbits)
    cnt = np.maximum(np.bincount(_counts_ok(sample), minlength=n_e) * (big_n / sample.size), hit)
    guess = int(np.argmin(_cost(np.concatenate([[0.0], np.cumsum(cnt)]), hs, big_n, n, scan)))
    if guess == 0:
        return 0, None
    small = small_positions(a, guess << mbits)
    e_small = exponents(a[small], mbits)
    exact = np.bincount(_counts_ok(e_small), minlength=guess)[:guess]
    cost = _cost(np.concatenate([[0.0], np.cumsum(exact)]), hs[: guess + 1], big_n, n, scan)
    best = int(np.argmin(cost))
    if best == 0 or cost[best] >= (1 - MIN_GAIN) * cost[0]:
        return 0, None
    return best, small if best == guess else np.compress(e_small < best, small)


def _rice(ranks: np.ndarray) -> tuple[list[bytes], int, int]:
    g = entropy.gaps(ranks)
    # Kiely's k for the mean gap, known without a pass (the gaps are close to geometric)
    k = entropy.rice_k((int(ranks[-1]) + 1 - ranks.size) / ranks.size) if ranks.size else 0
    unary, low, esc, n_esc = entropy.rice_encode(g, k)
    return [unary, low, esc], k, n_esc


def _unrice(unary, low, esc, n: int, k: int, limit: int) -> np.ndarray:
    """n sorted distinct ranks below `limit` from their gap stream; ValueError otherwise (a
    gap of `limit` or more, which an escape can carry, would wrap the sum)."""
    gaps = entropy.rice_decode(unary, low, esc, n, k)
    if gaps.size and gaps.max() >= limit:
        raise ValueError("rank out of range")
    ranks = (np.cumsum(gaps + np.uint64(1)) - np.uint64(1)).view(np.int64)
    if ranks.size and ranks[-1] >= limit:
        raise ValueError("rank out of range")
    return ranks


def zigzag(d: np.ndarray) -> np.ndarray:
    """W-bit wrapped differences (unsigned) -> W-bit zigzag, minus 1 (d is never 0): +1 and
    -1 become 1 and 0, small magnitudes stay small."""
    sd = d.view(f"i{d.itemsize}")
    return ((sd << 1) ^ (sd >> (8 * d.itemsize - 1))).view(d.dtype) - d.dtype.type(1)


def unzigzag(z: np.ndarray) -> np.ndarray:
    z = z + z.dtype.type(1)
    return ((z >> z.dtype.type(1)).view(f"i{z.itemsize}")
            ^ -(z & z.dtype.type(1)).view(f"i{z.itemsize}")).view(z.dtype)


def encode(pos: np.ndarray, a_pos: np.ndarray, b_pos: np.ndarray, e_pos: np.ndarray,
           threshold: int, S: np.ndarray, mbits: int, zc) -> tuple[bytes, tuple[int, ...]]:
    """-> (the one buffer, params). pos: changed positions (sorted); a_pos, b_pos: their old
    and new bits; e_pos: their old exponents; threshold and S from `plan` (0 and no S: no
    tier)."""
    if native.lib is not None:
        ranks, ranks_r, planes = native.tiered_split(S, pos, a_pos, b_pos, threshold, mbits)
    else:
        kd = entropy.float_key(b_pos) - entropy.float_key(a_pos)
        in_s = e_pos < threshold  # (index arrays below: numpy's boolean indexing is slower)
        i_s, i_r = np.flatnonzero(in_s), np.flatnonzero(~in_s)
        ranks = np.searchsorted(S, pos[i_s])  # where S's changed elements sit in S
        pos_r = pos[i_r]
        ranks_r = pos_r - np.searchsorted(S, pos_r)
        order = i_s[np.argsort(e_pos[i_s], kind="stable")]
        z = zigzag(np.concatenate([kd[order], kd[i_r]]))
        planes = z.view(np.uint8).reshape(-1, z.itemsize).T.copy()  # low bytes, then high
    mode = int(2 * ranks.size > S.size)  # 1: send the unchanged ones of S
    if mode:
        unchanged = np.ones(S.size, bool)
        unchanged[ranks] = False
        ranks = np.flatnonzero(unchanged)
    s_streams, k_s, esc_s = _rice(ranks)
    r_streams, k_r, esc_r = _rice(ranks_r)
    streams = [*s_streams, *r_streams, zc.compress(planes.data)]
    params = (threshold, mode, ranks.size, k_s, esc_s, k_r, esc_r, *(len(x) for x in streams[:-1]))
    return b"".join(streams), params


def decode(a: np.ndarray, buf, n_changed: int, params: tuple[int, ...], mbits: int):
    """-> (changed positions: S's, then R's; their key differences in that order, W-bit).
    Raises ValueError on a stream that does not fit the base."""
    if len(params) != 13:
        raise ValueError(f"tiered entry has {len(params)} params, not 13")
    threshold, mode, n_coded, k_s, esc_s, k_r, esc_r, *lens = params
    if not (0 <= threshold <= 1 << (8 * a.itemsize - 1 - mbits) and mode in (0, 1)
            and 0 <= min(k_s, k_r) and max(k_s, k_r) < 64 and min(n_coded, esc_s, esc_r) >= 0
            and min(lens) >= 0 and sum(lens) <= len(buf) and 0 < n_changed <= a.size):
        raise ValueError("tiered params out of range")
    cuts = np.cumsum([0, *lens, len(buf) - sum(lens)])
    u_s, l_s, e_s, u_r, l_r, e_r, values_z = (buf[cuts[i] : cuts[i + 1]] for i in range(7))
    S = small_positions(a, threshold << mbits) if threshold else NO_TIER
    ranks = _unrice(u_s, l_s, e_s, n_coded, k_s, S.size)
    if mode:
        keep = np.ones(S.size, bool)
        keep[ranks] = False
        pos_s = np.compress(keep, S)
    else:
        pos_s = S[ranks]
    n_r = n_changed - pos_s.size
    if n_r < 0:
        raise ValueError("more changes in tier S than in the tensor")
    r = _unrice(u_r, l_r, e_r, n_r, k_r, a.size - S.size)
    w = a.itemsize
    planes = zstandard.ZstdDecompressor().decompress(values_z, max_output_size=n_changed * w)
    if len(planes) != n_changed * w:
        raise ValueError(f"value stream holds {len(planes)} bytes, not {n_changed * w}")
    if native.lib is not None:
        return native.tiered_join(a, S, pos_s, r, planes, threshold, mbits)
    pos_r = r + np.searchsorted(S - np.arange(S.size), r, side="right")  # the r-th not in S
    kd = unzigzag(np.frombuffer(planes, np.uint8).reshape(w, -1).T.copy().view(a.dtype)
                  .reshape(-1))
    order = np.argsort(exponents(a[pos_s], mbits), kind="stable")
    kd_s = np.empty(pos_s.size, a.dtype)
    kd_s[order] = kd[: pos_s.size]
    return np.concatenate([pos_s, pos_r]), np.concatenate([kd_s, kd[pos_s.size :]])
