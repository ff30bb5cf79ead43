"""The two codecs: `full` (every byte) and `delta` (against the receiver's current state).

delta, per tensor, picks the smallest of:
- sparse: changed positions, gap-coded and Rice-coded; values as the integer difference of
  order-preserving bit keys (so +-1 ulp, across zero too, is a small number), zigzagged,
  coded as an exponent class (zstd: its Huffman stage) plus raw low bits. Positions and
  values are separate streams. Integer tensors, and float ones where "tiered" saves nothing.
- tiered (bf16, fp16, fp32, fp64; tiered.py): positions split by the old value's magnitude,
  which the receiver holds (the smallest weights change on nearly every step and cost almost
  nothing to locate); values as byte planes through zstd, ordered by old exponent. Where
  0.4-5%-dense bf16 RL updates land. The encoder uses it for a tensor when it estimates a
  saving; both methods stay decodable.
- xor: old ^ new, split into byte planes, zstd. For dense changes with large differences.
- raw: the new bytes. Never worse than a full send of that tensor.
Bit-exact for every dtype (floats get the key map, others are coded as plain integers):
NaN payloads, infinities, -0.0 and subnormals round-trip. Vectorised numpy throughout.
Not covered: GPU tensors (export to CPU first), structure changes between versions
(the publisher sends an anchor then), non-contiguous tensors.
"""

from __future__ import annotations

import numpy as np
import torch
import zstandard

from traingym.weights import entropy, tiered
from traingym.weights.base import BaseMismatch, IntegrityError, Payload, State, TensorEntry, UpdateHeader
from traingym.weights.base import register_codec
from traingym.weights.hashing import bits, dtype_name, dtype_of

XOR_MIN_DENSITY = 0.05  # below this, sparse always wins; skip the cost of trying xor


def changes(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(indices where a != b, a there, b there). Compares 8 bytes at a time; the lanes that
    differ within a changed word, and their old and new values, come from the two gathered
    words (no second gather from the large arrays)."""
    per = 8 // a.itemsize
    if not (per > 1 and a.size % per == 0 and a.size >= 1024):
        pos = np.flatnonzero(a != b)
        return pos, a[pos], b[pos]
    a64, b64 = a.view(np.uint64), b.view(np.uint64)
    words = tiered.flatnonzero_sparse(a64 != b64)
    aw, bw = a64[words].view(a.dtype), b64[words].view(a.dtype)  # lane j: element word*per+j
    lanes = np.flatnonzero(aw != bw)  # sorted
    shift = per.bit_length() - 1  # per is 2, 4 or 8
    pos = (words[lanes >> shift] << shift) | (lanes & (per - 1))
    return pos, aw[lanes], bw[lanes]


def changed_positions(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Indices where a != b (sorted)."""
    return changes(a, b)[0]


def _keys(x: np.ndarray, is_float: bool) -> np.ndarray:
    return entropy.float_key(x) if is_float else x


def _signed_diff(ka: np.ndarray, kb: np.ndarray) -> np.ndarray:
    """(kb - ka) modulo 2^W, read as a signed W-bit integer, widened to int64."""
    d = kb - ka
    return d.view(f"i{d.itemsize}").astype(np.int64)


def _entry(name: str, t: torch.Tensor, method: str, first: int, count: int, n: int,
           params: tuple[int, ...] = ()) -> TensorEntry:
    return TensorEntry(name, dtype_name(t.dtype), tuple(t.shape), method,
                       tuple(range(first, first + count)), n, params)


class _Builder:
    def __init__(self) -> None:
        self.entries: list[TensorEntry] = []
        self.buffers: list[memoryview] = []

    def add(self, name, t, method, bufs, n=0, params=()) -> None:
        self.entries.append(_entry(name, t, method, len(self.buffers), len(bufs), n, params))
        self.buffers.extend(memoryview(b).cast("B") for b in bufs)

    def payload(self, codec: str) -> Payload:
        return Payload(UpdateHeader(codec=codec, target_version=-1, target_hash="",
                                    tensors=tuple(self.entries)), self.buffers)


@register_codec("full")
class FullCodec:
    """Every tensor's bytes, copied (the payload must outlive later changes to the state)."""

    type = "full"

    def encode(self, old: State | None, new: State) -> Payload:
        out = _Builder()
        for name in sorted(new):
            out.add(name, new[name], "raw", [bits(new[name]).copy()])
        return out.payload("full")

    def decode(self, old: State | None, payload: Payload) -> State:
        return apply(None, payload)


@register_codec("delta")
class DeltaCodec:
    """Tiered or sparse / xor / raw per tensor, whichever is smallest. zstd `level` for the
    zstd parts."""

    type = "delta"

    def __init__(self, level: int = 1) -> None:
        self.level = level

    def encode(self, old: State | None, new: State) -> Payload:
        if old is None:
            raise ValueError("delta needs a base state; send a full update first")
        if set(old) != set(new):
            raise ValueError("delta needs the same tensor names in base and target")
        zc = zstandard.ZstdCompressor(level=self.level)
        out = _Builder()
        for name in sorted(new):
            o, t = old[name], new[name]
            if o.dtype != t.dtype or o.shape != t.shape:
                raise ValueError(f"{name}: dtype or shape changed; send a full update")
            a, b = bits(o), bits(t)
            pos, a_pos, b_pos = changes(a, b)
            if pos.size == 0:
                out.add(name, t, "same", [])
                continue
            options = [("raw", [b], ())]
            if pos.size < 0.5 * a.size:
                options.append(self._sparse(a, b, pos, a_pos, b_pos, t.dtype, zc))
            if pos.size >= XOR_MIN_DENSITY * a.size:
                planes = (a ^ b).view(np.uint8).reshape(-1, a.itemsize).T.copy()
                options.append(("xor", [zc.compress(planes.data)], ()))
            method, bufs, params = min(options, key=lambda o: sum(len(x) for x in o[1]))
            if method == "raw":
                bufs = [b.copy()]  # the payload must not alias the caller's tensor
            out.add(name, t, method, bufs, int(pos.size), params)
        return out.payload("delta")

    @staticmethod
    def _sparse(a, b, pos, a_pos, b_pos, dtype, zc):
        """-> ("tiered" or "sparse", buffers, params)."""
        is_float = dtype.is_floating_point
        ka, kb = _keys(a_pos, is_float), _keys(b_pos, is_float)
        mbits = tiered.MANTISSA_BITS.get(dtype)
        if mbits is not None:
            e_pos = tiered.exponents(a_pos, mbits)
            threshold, small = tiered.plan(a, e_pos, mbits)
            if threshold:
                buf, params = tiered.encode(a, b, pos, e_pos, kb - ka, threshold, small, zc)
                return "tiered", [buf], params
        d = _signed_diff(ka, kb)
        gaps = np.diff(pos, prepend=-1).astype(np.uint64) - np.uint64(1)
        k = entropy.best_k(gaps)
        unary, low, gesc, n_gesc = entropy.rice_encode(gaps, k)
        classes, mantissa = entropy.class_encode(entropy.zigzag(d) - np.uint64(1))
        return "sparse", [unary, low, gesc, zc.compress(classes), mantissa], (k, n_gesc)

    def decode(self, old: State | None, payload: Payload) -> State:
        if old is None:
            raise BaseMismatch("delta needs a base state")
        return apply({k: v.clone() for k, v in old.items()}, payload)


def _apply_tensor(a: np.ndarray, e: TensorEntry, bufs: list[memoryview], dtype: torch.dtype):
    is_float = dtype.is_floating_point
    if e.method == "same":
        return
    if e.method == "raw":
        src = np.frombuffer(bufs[0], a.dtype)
        if src.size != a.size:
            raise IntegrityError(f"{e.name}: raw buffer has {src.size} elements, not {a.size}")
        a[:] = src
    elif e.method == "xor":
        planes = np.frombuffer(zstandard.ZstdDecompressor().decompress(bufs[0]), np.uint8)
        if planes.size != a.nbytes:
            raise IntegrityError(f"{e.name}: xor stream has the wrong size")
        a ^= planes.reshape(a.itemsize, -1).T.copy().view(a.dtype).reshape(-1)
    elif e.method == "sparse":
        k, n_gesc = e.params
        unary, low, gesc, classes_z, mantissa = bufs
        gaps = entropy.rice_decode(unary, low, gesc, e.n_changed, k)
        pos = (np.cumsum(gaps + np.uint64(1)) - np.uint64(1)).view(np.int64)
        if pos.size and (pos[-1] >= a.size or pos[-1] < 0):
            raise IntegrityError(f"{e.name}: position out of range")
        classes = zstandard.ZstdDecompressor().decompress(classes_z,
                                                          max_output_size=e.n_changed)
        d = entropy.unzigzag(entropy.class_decode(classes, mantissa) + np.uint64(1))
        if d.size != pos.size:
            raise IntegrityError(f"{e.name}: {d.size} values for {pos.size} positions")
        ka = _keys(a[pos], is_float)
        kb = ka + d.astype(ka.dtype)  # wraps modulo 2^W, the inverse of _signed_diff
        a[pos] = entropy.float_unkey(kb) if is_float else kb
    elif e.method == "tiered":
        if dtype not in tiered.MANTISSA_BITS or len(bufs) != 1:
            raise IntegrityError(f"{e.name}: tiered entry for {dtype} with {len(bufs)} buffers")
        pos, kd = tiered.decode(a, bufs[0], e.n_changed, e.params, tiered.MANTISSA_BITS[dtype])
        a[pos] = entropy.float_unkey(entropy.float_key(a[pos]) + kd)
    else:
        raise IntegrityError(f"{e.name}: unknown method {e.method!r}")


def apply(state: State | None, payload: Payload) -> State:
    """Apply a payload. Writes into `state`'s tensors in place where it can; returns the
    resulting state. A full payload with a different structure makes fresh tensors."""
    h = payload.header
    if h.codec == "delta" and state is None:
        raise BaseMismatch("delta needs a base state")
    if h.codec == "delta" and set(state) != {e.name for e in h.tensors}:
        raise BaseMismatch("delta names tensors the base does not have")
    out: State = {}
    for e in h.tensors:
        dtype = dtype_of(e.dtype)
        t = state.get(e.name) if state is not None else None
        if t is None or t.dtype != dtype or tuple(t.shape) != e.shape:
            if h.codec == "delta":
                raise BaseMismatch(f"{e.name}: base has another dtype or shape")
            t = torch.empty(e.shape, dtype=dtype)
        bufs = [payload.buffers[i] for i in e.buffers]
        try:
            _apply_tensor(bits(t), e, bufs, t.dtype)
        except (ValueError, zstandard.ZstdError) as err:
            raise IntegrityError(f"{e.name}: corrupt stream: {err}") from err
        out[e.name] = t
    return out
