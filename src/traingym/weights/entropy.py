"""Vectorised integer coders for the delta codec: order-preserving float keys, zigzag,
Rice codes with escapes for gap-coded positions, and an escaped byte stream for values.

Rice coding splits each value v into a quotient q = v >> k, written in unary, and k low
bits. The unary parts and the fixed-width parts go to separate bit streams, so that both
encoding and decoding are a handful of numpy passes (no per-element Python). A quotient of
QMAX or more is an escape: the value is stored whole in a third stream, which bounds the
cost of the rare long gap. For geometric gaps Rice codes with the best k (`rice_k`, Kiely's
formula, or `best_k`'s search around it) are within about 3% of the entropy; they do not
adapt within a tensor (a clustered tensor pays for that). The "sparse" method's values use
exponent classes (bit length, entropy-coded by the caller) plus raw low bits. Bit streams are
packed into 64-bit words with shifts (`pack_fixed`: groups of 64 k-bit fields fill exactly k
words; `pack_bits`: variable lengths via offsets), the same bits np.packbits would give.
"""

from __future__ import annotations

import functools

import numpy as np

from traingym.weights import native

QMAX = 40
_SAMPLE = 1 << 11
_LOG_PHI_1 = float(np.log((1 + 5**0.5) / 2 - 1))


def float_key(x: np.ndarray) -> np.ndarray:
    """Map float bit patterns to unsigned integers in numeric order (-0.0 next to +0.0)."""
    top = x.dtype.type(1 << (x.dtype.itemsize * 8 - 1))
    ones = x.dtype.type(np.iinfo(x.dtype).max)
    sign = x >> (x.dtype.itemsize * 8 - 1)
    return x ^ ((sign * ones) | top)


def float_unkey(k: np.ndarray) -> np.ndarray:
    top = k.dtype.type(1 << (k.dtype.itemsize * 8 - 1))
    ones = k.dtype.type(np.iinfo(k.dtype).max)
    was_positive = k >> (k.dtype.itemsize * 8 - 1)
    return k ^ (((1 - was_positive) * ones) | top)


def zigzag(d: np.ndarray) -> np.ndarray:
    """int64 -> uint64 with small magnitudes first: 0, -1, 1, -2, 2 -> 0, 1, 2, 3, 4."""
    return ((d << 1) ^ (d >> 63)).view(np.uint64)


def unzigzag(z: np.ndarray) -> np.ndarray:
    return ((z >> np.uint64(1)).view(np.int64)) ^ -((z & np.uint64(1)).view(np.int64))


def pack_bits(v: np.ndarray, lengths: np.ndarray) -> bytes:
    """The low lengths[i] bits (0..64) of each v[i], concatenated most significant first,
    zero-padded to a byte. v must fit its length. Vectorised over 64-bit output words:
    each field lands in one word, or is split across two (numpy shifts by 64 or more give
    0, which the formulas below rely on)."""
    if v.size == 0:
        return b""
    L = lengths.astype(np.uint64)
    end = np.cumsum(L)
    total = int(end[-1])
    if total == 0:
        return b""
    off = end - L
    w = off >> np.uint64(6)
    s = off & np.uint64(63)
    fits = s + L <= np.uint64(64)
    v = v.astype(np.uint64, copy=False)
    main = np.where(fits, v << (np.uint64(64) - s - L), v >> (s + L - np.uint64(64)))
    words = np.zeros(total // 64 + 2, np.uint64)  # empty fields may start past the end
    first = np.flatnonzero(np.diff(w, prepend=np.uint64(1) << np.uint64(63)))
    words[w[first]] = np.bitwise_or.reduceat(main, first)
    split = np.flatnonzero(~fits)  # at most one field crosses each word boundary
    words[w[split] + np.uint64(1)] |= v[split] << (np.uint64(128) - s[split] - L[split])
    return words.astype(">u8").tobytes()[: (total + 7) // 8]


def unpack_bits(data, lengths: np.ndarray) -> np.ndarray:
    """Inverse of pack_bits: uint64 values of the given bit lengths."""
    n = lengths.size
    if n == 0:
        return np.zeros(0, np.uint64)
    L = lengths.astype(np.uint64)
    end = np.cumsum(L)
    total = int(end[-1])
    raw = np.frombuffer(data, np.uint8)
    if raw.size * 8 < total:
        raise ValueError("bit stream too short")
    nwords = total // 64 + 2  # room for the word after the last field, even an empty one
    buf = np.zeros(nwords * 8, np.uint8)
    buf[: min(raw.size, nwords * 8)] = raw[: nwords * 8]
    words = buf.view(">u8").astype(np.uint64)
    off = end - L
    w = off >> np.uint64(6)
    s = off & np.uint64(63)
    x = (words[w] << s) | (words[w + np.uint64(1)] >> (np.uint64(64) - s))
    return x >> (np.uint64(64) - L)


@functools.cache
def _lanes(k: int):
    """For k-bit fields, 64 of them fill exactly k 64-bit words. Per lane j of such a group:
    its word and bit offset in that word; the lanes that spill into the next word; the
    first lane of each word; the left shifts that place the non-spilling lanes."""
    off = np.arange(64, dtype=np.uint64) * np.uint64(k)
    word, shift = off >> np.uint64(6), off & np.uint64(63)
    spill = shift + np.uint64(k) > np.uint64(64)
    starts = np.flatnonzero(np.diff(word, prepend=np.uint64(1) << np.uint64(63)))
    place = np.where(spill, np.uint64(0), np.uint64(64) - shift - np.uint64(k))
    return word, shift, np.flatnonzero(spill), starts, place


def gaps(ranks: np.ndarray) -> np.ndarray:
    """Sorted distinct non-negative ints -> the number of values skipped before each, as
    uint64 (the first counts from 0)."""
    g = np.empty(ranks.size, np.uint64)
    if ranks.size:
        g[0] = ranks[0]
        np.subtract(ranks[1:], ranks[:-1], out=g[1:], casting="unsafe")
        g[1:] -= np.uint64(1)
    return g


def pack_fixed(v: np.ndarray, k: int) -> bytes:
    """The low k bits (1..64) of each value, concatenated most significant first, zero-padded
    to a byte. Vectorised over groups of 64 values, which fill exactly k words."""
    if k == 0 or v.size == 0:
        return b""
    n, kk = v.size, np.uint64(k)
    x = np.zeros(-(-n // 64) * 64, np.uint64)
    x[:n] = v
    x &= np.uint64((1 << k) - 1) if k < 64 else np.uint64(2**64 - 1)
    x = x.reshape(-1, 64)
    word, shift, sp, starts, place = _lanes(k)  # at most k - 1 lanes (sp) cross a word end
    main = x << place
    main[:, sp] = x[:, sp] >> (shift[sp] + kk - np.uint64(64))
    out = np.bitwise_or.reduceat(main, starts, axis=1)  # (groups, k)
    out[:, word[sp] + np.uint64(1)] |= x[:, sp] << (np.uint64(128) - shift[sp] - kk)
    return out.astype(">u8").tobytes()[: (n * k + 7) // 8]


def unpack_fixed(data, k: int, n: int) -> np.ndarray:
    if k == 0 or n == 0:
        return np.zeros(n, np.uint64)
    raw = np.frombuffer(data, np.uint8)
    if raw.size * 8 < n * k:
        raise ValueError("fixed-width stream too short")
    groups = -(-n // 64)
    buf = np.zeros(groups * k * 8, np.uint8)
    m = min(raw.size, buf.size)
    buf[:m] = raw[:m]
    words = buf.view(">u8").astype(np.uint64).reshape(groups, k)
    word, shift, sp, _, place = _lanes(k)  # a spilling lane ends in its group: word + 1 < k
    kk, mask = np.uint64(k), np.uint64(2**64 - 1 >> (64 - k))
    x = words[:, word] >> place
    x[:, sp] = ((words[:, word[sp]] << (shift[sp] + kk - np.uint64(64)))
                | (words[:, word[sp] + np.uint64(1)] >> (np.uint64(128) - shift[sp] - kk)))
    x &= mask
    return x.reshape(-1)[:n]


def rice_cost(v: np.ndarray, k: int) -> int:
    q = v >> np.uint64(k)
    esc = int(np.count_nonzero(q >= QMAX))
    return int(np.minimum(q, QMAX).sum()) + v.size + k * (v.size - esc) + 32 * esc


def rice_k(mean: float) -> int:
    """The best Rice parameter for geometrically distributed values of this mean (Kiely,
    "Selecting the Golomb parameter in Rice coding", 2004)."""
    if mean <= 0:
        return 0
    return max(0, 1 + int(np.floor(np.log2(_LOG_PHI_1 / np.log(mean / (mean + 1))))))


def best_k(v: np.ndarray) -> int:
    """The Rice parameter with the smallest cost on a sample of v: the optimum for a
    geometric distribution of the sample's mean (Kiely's formula) and its two neighbours,
    costed in one vectorised pass (gaps are not exactly geometric)."""
    if v.size == 0:
        return 0
    sample = v[:: max(1, v.size // _SAMPLE)]
    k0 = rice_k(float(sample.mean()))
    ks = np.arange(max(0, k0 - 1), min(63, k0 + 2), dtype=np.uint64)
    q = sample[None, :] >> ks[:, None]
    esc = np.count_nonzero(q >= QMAX, axis=1)
    cost = np.minimum(q, QMAX).sum(axis=1) + ks * (sample.size - esc) + 32 * esc
    return int(ks[int(np.argmin(cost))])


def rice_encode(v: np.ndarray, k: int) -> tuple[bytes, bytes, bytes, int]:
    """-> (unary stream, low-bits stream, escaped values as uint64, number of escapes)."""
    if native.lib is not None:
        return native.rice_encode(v, k)
    q = v >> np.uint64(k)
    esc = q >= QMAX
    n_esc = int(np.count_nonzero(esc))
    if n_esc:
        q = np.minimum(q, QMAX)
    q += np.uint64(1)
    ends = np.cumsum(q, out=q) - np.uint64(1)
    unary = np.zeros(int(ends[-1]) + 1 if v.size else 0, np.uint8)
    unary[ends] = 1
    low = np.compress(~esc, v) if n_esc else v  # pack_fixed keeps only the low k bits
    escaped = np.compress(esc, v).tobytes() if n_esc else b""
    return np.packbits(unary).tobytes(), pack_fixed(low, k), escaped, n_esc


def rice_decode(unary, low, escaped, n: int, k: int) -> np.ndarray:
    if native.lib is not None:
        return native.rice_decode(unary, low, escaped, n, k)
    ones = np.flatnonzero(np.unpackbits(np.frombuffer(unary, np.uint8)))[:n]
    if ones.size != n:
        raise ValueError("unary stream too short")
    q = gaps(ones)
    esc = q == QMAX
    n_esc = int(np.count_nonzero(esc))
    esc_vals = np.frombuffer(escaped, np.uint64)
    if esc_vals.size != n_esc:
        raise ValueError("escape stream does not match the unary stream")
    if not n_esc:
        q <<= np.uint64(k)
        q |= unpack_fixed(low, k, n)
        return q
    out = np.empty(n, np.uint64)
    out[esc] = esc_vals
    keep = np.flatnonzero(~esc)
    out[keep] = (q[keep] << np.uint64(k)) | unpack_fixed(low, k, keep.size)
    return out


_BITLEN16 = np.zeros(1 << 16, np.uint8)
for _b in range(16):
    _BITLEN16[1 << _b : 1 << (_b + 1)] = _b + 1


def _bit_length(v: np.ndarray) -> np.ndarray:
    """Number of significant bits of each value (0 for 0), as uint8."""
    if v.size == 0 or int(v.max()) < (1 << 16):
        return _BITLEN16[v]
    out = np.zeros(v.shape, np.uint8)
    x = v.copy()
    for shift in (32, 16, 8, 4, 2, 1):  # binary search, 6 vector passes for 64-bit values
        big = x >= (np.uint64(1) << np.uint64(shift))
        out[big] += shift
        x[big] >>= np.uint64(shift)
    out[x > 0] += 1
    return out


def class_encode(v: np.ndarray) -> tuple[bytes, bytes]:
    """Exponent-class coding: each value's bit length (one byte, for an entropy coder), and
    the bits below its leading one, concatenated (raw). Near-optimal for magnitudes spread
    over many octaves, exact for small ones (0 and 1 cost only their class)."""
    cls = _bit_length(v)
    low = np.maximum(cls, 1) - 1  # bits below the leading one
    mask = (np.uint64(1) << low.astype(np.uint64)) - np.uint64(1)
    return cls.tobytes(), pack_bits(v & mask, low)


def class_decode(classes, mantissa) -> np.ndarray:
    cls = np.frombuffer(classes, np.uint8)
    if cls.size and int(cls.max()) > 64:
        raise ValueError("value class out of range")
    low = np.maximum(cls, 1) - 1
    lead = np.where(cls > 0, np.uint64(1) << low.astype(np.uint64), np.uint64(0))
    return lead | unpack_bits(mantissa, low)
