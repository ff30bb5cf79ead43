"""The two codecs: `full` (every byte) and `delta` (against the receiver's current state).

delta picks per tensor the smallest of: sparse (gap/Rice-coded positions, values as zigzagged
differences of order-preserving bit keys, so +-1 ulp is small); tiered (floats, tiered.py: positions
split by the old value's magnitude, which the receiver holds; values as zstd byte planes), where
sparse RL updates land; xor (dense large changes); raw (never worse than full). Tiered splits only
where the saving beats the extra passes at the link's speed (threshold 0 otherwise: 1% larger than
sparse but 2.8x faster to code, BENCHMARKS.md "Where a delta's time goes").
Bit-exact for every dtype (NaN payloads, -0.0, subnormals round-trip); numpy throughout, with the
per-element loops in C where built (native.py, same bits). With `threads` > 1 the state is cut into
runs of about equal bytes, coded and applied in parallel as separate entries. Both directions report
their `Changes`, including the additive hash's movement (lthash.py), in O(changes).
Not covered: GPU tensors (export to CPU first), structure changes (the publisher sends an anchor),
non-contiguous tensors.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch
import zstandard

from traingym.weights import entropy, lthash, native, tiered
from traingym.weights.base import (
    BaseMismatch,
    CastView,
    Changed,
    IntegrityError,
    Payload,
    State,
    TensorEntry,
    UpdateHeader,
)
from traingym.weights.changes import Changes, Pool, plan_pieces
from traingym.weights.extract import cast_changes, changes, changes_at
from traingym.weights.hashing import bits, dtype_name, dtype_of

XOR_MIN_DENSITY = 0.05  # below this, sparse always wins; skip the cost of trying xor
_NO_HINT = object()  # _piece compares the whole piece (no base.Changed positions given)


def _keys(x: np.ndarray, is_float: bool) -> np.ndarray:
    return entropy.float_key(x) if is_float else x


def _signed_diff(ka: np.ndarray, kb: np.ndarray) -> np.ndarray:
    """(kb - ka) modulo 2^W, read as a signed W-bit integer, widened to int64."""
    d = kb - ka
    return d.view(f"i{d.itemsize}").astype(np.int64)


def _entry(name: str, t: torch.Tensor, method: str, first: int, count: int, n: int,
           params: tuple[int, ...] = (), span: tuple[int, ...] = ()) -> TensorEntry:
    return TensorEntry(name, dtype_name(t.dtype), tuple(t.shape), method,
                       tuple(range(first, first + count)), n, params, span)


class _Builder:
    def __init__(self) -> None:
        self.entries: list[TensorEntry] = []
        self.buffers: list[memoryview] = []

    def add(self, name, t, method, bufs, n=0, params=(), span=()) -> None:
        self.entries.append(_entry(name, t, method, len(self.buffers), len(bufs), n, params,
                                   span))
        self.buffers.extend(memoryview(b).cast("B") for b in bufs)

    def payload(self, codec: str) -> Payload:
        return Payload(UpdateHeader(codec=codec, target_version=-1, target_hash="",
                                    tensors=tuple(self.entries)), self.buffers)


class FullCodec:
    """Every tensor's bytes, copied (the payload must outlive later changes to the state),
    except a cast a CastView made for this read, which nothing else holds. Its payload's
    state hash can be read from the payload (hashing.raw_state_hash), not the state again."""

    type = "full"
    delta = False  # whole states: an anchor needs no base

    def encode(self, old: State | None, new: State) -> Payload:
        out = _Builder()
        for name in sorted(new):
            t = new[name]
            fresh = isinstance(new, CastView) and new.made(name, t)
            out.add(name, t, "raw", [bits(t) if fresh else bits(t).copy()])
        return out.payload("full")

    def decode(self, old: State | None, payload: Payload) -> State:
        return apply(None, payload)


def _hint(changed: Changed, name: str) -> tuple:
    """(positions or None, (old bits, new bits) or None) of `name` in `changed`."""
    pos = changed.positions.get(name)
    if pos is None or changed.old is None or changed.new is None:
        return pos, None
    return pos, (changed.old[name], changed.new[name])


class DeltaCodec:
    """Tiered or sparse / xor / raw per tensor, whichever is smallest. zstd `level` for the
    zstd parts. With `threads` > 1 the state is cut into that many runs of about equal bytes
    (`plan_pieces`) and each thread codes its own run; the pieces are independent entries
    of the payload (any receiver can apply them in parallel)."""

    type = "delta"
    delta = True  # changes against a base, with the additive hash's movement (sync.py)

    def __init__(self, level: int = 1, threads: int = 1) -> None:
        self.level, self.threads = level, threads
        self._pool = Pool(threads)

    def encode(self, old: State | None, new: State) -> Payload:
        return self.encode_changes(old, new, with_sum=False)[0]

    def encode_changes(self, old: State | None, new: State, with_sum: bool = True,
                       cast: torch.dtype | None = None,
                       link_s_per_byte: float | None = None,
                       changed: Changed | None = None) -> tuple[Payload, Changes]:
        """The payload and its changes (the additive hash's movement, the changed elements), so the
        sender updates its hash and shadow in O(changes). With `cast`, `new` holds the trainer's
        tensors and the target is their cast: each piece is cast and compared in one pass
        (`extract.cast_changes`), without a whole cast copy unless xor/raw may code it.
        `link_s_per_byte` (None: fewest bytes) lets a tensor take a tier only where the bytes
        saved take longer to send than its passes (tiered.scan_bits). `changed` names where
        changes may be: only those elements are read, or none where it holds their values
        (extract.changes_at); no comparison pass over the state."""
        if old is None:
            raise ValueError("delta needs a base state; send a full update first")
        if set(old) != set(new):
            raise ValueError("delta needs the same tensor names in base and target")
        for name in new:
            dtype = new[name].dtype if cast is None else cast
            if old[name].dtype != dtype or old[name].shape != new[name].shape:
                raise ValueError(f"{name}: dtype or shape changed; send a full update")
        runs = plan_pieces(old, self.threads)
        whole = len(runs) == 1
        scan = tiered.scan_bits(link_s_per_byte, len(runs))

        def run(pieces):
            zc = zstandard.ZstdCompressor(level=self.level)
            return [self._piece(name, old[name], new[name], start, stop, whole, zc, with_sum,
                                cast, scan, _NO_HINT if changed is None else _hint(changed, name))
                    for name, start, stop in pieces]

        out, changes = _Builder(), Changes()
        for results in self._pool.map(run, runs):
            for name, method, bufs, n, params, span, pos, b_pos, s, times in results:
                out.add(name, old[name], method, bufs, n, params, span)
                changes.sum += s
                changes.add(times)
                changes.n_changed += n
                if n:
                    changes.pieces.append((name, span[0] if span else 0, pos, b_pos))
        return out.payload("delta"), changes

    def _piece(self, name, o, t, start, stop, whole, zc, with_sum, cast=None, scan=0.0,
               hint=_NO_HINT):
        t0 = time.perf_counter()
        a = bits(o)
        span = () if whole or (start, stop) == (0, a.size) else (start, stop)
        numel = a.size
        a = a[start:stop]
        b = None
        if hint is not _NO_HINT:
            pos, a_pos, b_pos = changes_at(t.detach().reshape(-1)[start:stop], a, cast, hint[0],
                                           start, hint[1])
        elif cast is None:
            b = bits(t)[start:stop]
            pos, a_pos, b_pos = changes(a, b)
        else:
            pos, a_pos, b_pos = cast_changes(t.detach().reshape(-1)[start:stop], a, cast)
        t1 = time.perf_counter()
        if pos.size == 0:
            return name, "same", [], 0, (), span, pos, b_pos, lthash.zero(), \
                {"extract": t1 - t0}
        if b is None and pos.size >= XOR_MIN_DENSITY * a.size:
            b = a.copy()  # the target piece, for "xor" and "raw"
            b[pos] = b_pos
        # raw is priced at a.size, its element count (not a.nbytes): the choices are tuned to it
        method, bufs, params, size = "raw", None, (), a.size
        options = []
        if pos.size < 0.5 * a.size:
            options.append(self._sparse(a, pos, a_pos, b_pos, o.dtype, zc, scan))
        if pos.size >= XOR_MIN_DENSITY * a.size:
            planes = (a ^ b).view(np.uint8).reshape(-1, a.itemsize).T.copy()
            options.append(("xor", [zc.compress(planes.data)], ()))
        for m, bs, ps in options:  # the first smallest, raw first (as min() over all)
            n_bytes = sum(len(x) for x in bs)
            if n_bytes < size:
                method, bufs, params, size = m, bs, ps, n_bytes
        if method == "raw":
            if b is None:
                b = a.copy()
                b[pos] = b_pos
            bufs = [b.copy()]  # the payload must not alias the caller's tensor
        t2 = time.perf_counter()
        s = lthash.change_sum(name, numel, pos + start, a_pos, b_pos) if with_sum \
            else lthash.zero()
        t3 = time.perf_counter()
        return name, method, bufs, int(pos.size), params, span, pos, b_pos, s, \
            {"extract": t1 - t0, "code": t2 - t1, "verify": t3 - t2}

    def write(self, state: State, changes: Changes) -> None:
        """Write an encode's changed elements into `state` (its base: the publisher's shadow
        becomes the target), by this codec's threads, each its own pieces."""
        groups = [changes.pieces[i :: self.threads] for i in range(self.threads)]

        def run(pieces):
            for name, start, pos, new_bits in pieces:
                bits(state[name])[start:][pos] = new_bits

        self._pool.map(run, [g for g in groups if g])

    @staticmethod
    def _sparse(a, pos, a_pos, b_pos, dtype, zc, scan=0.0):
        """-> ("tiered" or "sparse", buffers, params); `scan`: tiered.plan's."""
        mbits = tiered.MANTISSA_BITS.get(dtype)
        if mbits is not None:
            pays = tiered.may_pay(pos.size, a.size, scan)
            # the exponents: for the plan, and for NumPy's split (C's finds its own)
            e_pos = tiered.exponents(a_pos, mbits) if pays or native.lib is None else None
            threshold, small = tiered.plan(a, e_pos, mbits, scan) if pays else (0, None)
            buf, params = tiered.encode(pos, a_pos, b_pos, e_pos, threshold,
                                        tiered.NO_TIER if small is None else small, mbits, zc)
            return "tiered", [buf], params
        is_float = dtype.is_floating_point
        d = _signed_diff(_keys(a_pos, is_float), _keys(b_pos, is_float))
        gaps = np.diff(pos, prepend=-1).astype(np.uint64) - np.uint64(1)
        k = entropy.best_k(gaps)
        unary, low, gesc, n_gesc = entropy.rice_encode(gaps, k)
        classes, mantissa = entropy.class_encode(entropy.zigzag(d) - np.uint64(1))
        return "sparse", [unary, low, gesc, zc.compress(classes), mantissa], (k, n_gesc)

    def decode(self, old: State | None, payload: Payload) -> State:
        if old is None:
            raise BaseMismatch("delta needs a base state")
        return apply({k: v.clone() for k, v in old.items()}, payload)


def _write(a: np.ndarray, pos: np.ndarray, new: np.ndarray, want: bool, times: dict, t0):
    """a[pos] = new; -> (pos, old, new) for the hash when `want`."""
    old = a[pos] if want else None
    t1 = time.perf_counter()
    a[pos] = new
    times["decode"], times["apply"] = t1 - t0, time.perf_counter() - t1
    return (pos, old, new) if want else None


class Moved(NamedTuple):
    """What a fused apply (native.apply_keys) wrote: its count, and the hash's movement."""
    n: int
    sum: np.ndarray


def _apply_keys(a, pos, kd, is_float, want, at, e, times, t0) -> Moved:
    """a[pos] moves by kd in key space, with the hash's movement (when `want`) in the same
    C pass: its time is "apply" (decode's own ends before it)."""
    t1 = time.perf_counter()
    keys = lthash.tensor_keys(e.name) if want else None
    moved = native.apply_keys(a, pos, kd, is_float, keys, lthash.packs(a.itemsize, at[0]),
                              at[1])
    times["decode"], times["apply"] = t1 - t0, time.perf_counter() - t1
    return Moved(int(pos.size), moved)


def _apply_tensor(a: np.ndarray, e: TensorEntry, bufs: list[memoryview], dtype: torch.dtype,
                  want: bool, times: dict, at: tuple[int, int] = (0, 0)):
    """Apply one entry to `a` (its piece, from element at[1], of a tensor of at[0] elements;
    bits). -> (positions, old bits, new bits) of the changed elements when `want` (for the
    incremental hash), else None; or, with the C kernels, `Moved` (written and hashed in one
    pass) for "sparse" and "tiered" entries."""
    t0 = time.perf_counter()
    is_float = dtype.is_floating_point
    if e.method == "same":
        return None
    if e.method == "raw":
        src = np.frombuffer(bufs[0], a.dtype)
        if src.size != a.size:
            raise IntegrityError(f"{e.name}: raw buffer has {src.size} elements, not {a.size}")
        if not want:
            a[:] = src
            times["apply"] = time.perf_counter() - t0
            return None
        pos, old, new = changes(a, src)
        t1 = time.perf_counter()
        a[pos] = new
        times["decode"], times["apply"] = t1 - t0, time.perf_counter() - t1
        return pos, old, new
    if e.method == "xor":
        planes = np.frombuffer(zstandard.ZstdDecompressor().decompress(bufs[0]), np.uint8)
        if planes.size != a.nbytes:
            raise IntegrityError(f"{e.name}: xor stream has the wrong size")
        x = planes.reshape(a.itemsize, -1).T.copy().view(a.dtype).reshape(-1)
        if not want:
            a ^= x
            times["apply"] = time.perf_counter() - t0
            return None
        pos = tiered.flatnonzero_sparse(x != 0)
        return _write(a, pos, a[pos] ^ x[pos], want, times, t0)
    if e.method == "sparse":
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
        if native.lib is not None:
            return _apply_keys(a, pos, d.astype(a.dtype), is_float, want, at, e, times, t0)
        ka = _keys(a[pos], is_float)
        kb = ka + d.astype(ka.dtype)  # wraps modulo 2^W, the inverse of _signed_diff
        return _write(a, pos, entropy.float_unkey(kb) if is_float else kb, want, times, t0)
    if e.method == "tiered":
        if dtype not in tiered.MANTISSA_BITS or len(bufs) != 1:
            raise IntegrityError(f"{e.name}: tiered entry for {dtype} with {len(bufs)} buffers")
        pos, kd = tiered.decode(a, bufs[0], e.n_changed, e.params, tiered.MANTISSA_BITS[dtype])
        if native.lib is not None:
            return _apply_keys(a, pos, kd, True, want, at, e, times, t0)
        new = entropy.float_unkey(entropy.float_key(a[pos]) + kd)
        return _write(a, pos, new, want, times, t0)
    raise IntegrityError(f"{e.name}: unknown method {e.method!r}")


def _span(e: TensorEntry, numel: int) -> tuple[int, int]:
    if not e.span:
        return 0, numel
    if len(e.span) != 2 or not 0 <= e.span[0] <= e.span[1] <= numel:
        raise IntegrityError(f"{e.name}: piece {e.span} outside a tensor of {numel} elements")
    return e.span[0], e.span[1]


def _groups(entries: list, threads: int) -> list[list]:
    """Contiguous runs of entries of about equal work (buffer bytes plus changed elements)."""
    if threads == 1 or len(entries) <= 1:
        return [entries]
    cost = np.cumsum([1 + e.n_changed + sum(e.sizes) for e in entries])
    cuts = np.searchsorted(cost, cost[-1] * np.arange(1, threads) / threads)
    bounds = sorted({0, len(entries), *(min(len(entries), int(c) + 1) for c in cuts)})
    return [entries[i:j] for i, j in zip(bounds, bounds[1:])]


_POOLS: dict[int, Pool] = {}


def apply(state: State | None, payload: Payload, threads: int = 1) -> State:
    """Apply a payload. Writes into `state`'s tensors in place where it can; returns the
    resulting state. A full payload with a different structure makes fresh tensors."""
    return apply_changes(state, payload, threads, with_sum=False)[0]


def apply_changes(state: State | None, payload: Payload, threads: int = 1,
                  with_sum: bool = True) -> tuple[State, Changes]:
    """`apply`, and the changes it made: the additive hash's movement, computed from the old
    bits each write replaced and the new bits it wrote (lthash.py). Pieces are applied by
    `threads` threads (they write disjoint ranges)."""
    h = payload.header
    if h.codec == "delta" and state is None:
        raise BaseMismatch("delta needs a base state")
    if h.codec == "delta" and set(state) != {e.name for e in h.tensors}:
        raise BaseMismatch("delta names tensors the base does not have")
    out: State = {}
    work = []
    for e in h.tensors:
        dtype = dtype_of(e.dtype)
        t = out.get(e.name)
        if t is None:
            t = state.get(e.name) if state is not None else None
            if t is None or t.dtype != dtype or tuple(t.shape) != e.shape:
                if h.codec == "delta":
                    raise BaseMismatch(f"{e.name}: base has another dtype or shape")
                t = torch.empty(e.shape, dtype=dtype)
            out[e.name] = t
        elif t.dtype != dtype or tuple(t.shape) != e.shape:
            raise IntegrityError(f"{e.name}: pieces disagree on dtype or shape")
        if any(i >= len(payload.buffers) for i in e.buffers):
            raise IntegrityError(f"{e.name}: buffer index out of range")
        work.append(_Work(e, t, dtype, [payload.buffers[i] for i in e.buffers]))
    pool = _POOLS.setdefault(threads, Pool(threads))
    changes_ = Changes()
    for part in pool.map(lambda g: _apply_group(g, with_sum), _groups(work, threads)):
        changes_.sum += part.sum
        changes_.add(part.times)
        changes_.n_changed += part.n_changed
    return out, changes_


@dataclass
class _Work:
    e: TensorEntry
    t: torch.Tensor
    dtype: torch.dtype
    bufs: list

    @property
    def n_changed(self) -> int:
        return self.e.n_changed

    @property
    def sizes(self):
        return [b.nbytes for b in self.bufs]


def _apply_group(group: list[_Work], with_sum: bool) -> Changes:
    part = Changes()
    for w in group:
        full = bits(w.t)
        start, stop = _span(w.e, full.size)
        times: dict = {}
        try:
            got = _apply_tensor(full[start:stop], w.e, w.bufs, w.dtype, with_sum, times,
                                (full.size, start))
        except (ValueError, zstandard.ZstdError) as err:
            raise IntegrityError(f"{w.e.name}: corrupt stream: {err}") from err
        if isinstance(got, Moved):
            part.sum += got.sum
            part.n_changed += got.n
        elif got is not None:
            t0 = time.perf_counter()
            pos, old, new = got
            part.sum += lthash.change_sum(w.e.name, full.size, pos + start, old, new)
            part.n_changed += int(pos.size)
            times["verify"] = time.perf_counter() - t0
        part.add(times)
    return part
