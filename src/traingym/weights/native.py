"""The delta codec's C kernels (_native.c), with the NumPy signatures of the functions they
replace: extract.changes (and, for trainer/step_changes.py, the bf16 casts' changes),
tiered.small_positions, lthash.change_sum, entropy.rice_encode /
rice_decode, and the tiered method's planning (tiered.plan) and reorderings (tiered.encode's
ranks and value planes, tiered.decode's positions and values). Each gives the same bits as
its NumPy version (tests/weights/test_native.py), so a payload coded on either side decodes
on the other. One caveat: the plan's costs are floating-point sums that may round
differently, so on a near-tie the two may pick different thresholds (either payload still
decodes on both sides).

`lib` is the compiled module, or None where it was not built (no C compiler at install: the
build skips it, setup.py) or TRAINGYM_NATIVE=0 is set; callers then use NumPy.
"""

from __future__ import annotations

import os

import numpy as np

try:
    from traingym.weights import _native as lib
except ImportError:  # built without a C compiler
    lib = None
if os.environ.get("TRAINGYM_NATIVE", "1") == "0":
    lib = None


def _grow(n: int, found: int, done: int) -> int:
    """A capacity for the rest of an array of n, from the rate found so far."""
    rate = (found + 1) / max(done, 1)
    return int(min(n, max(1024, 1.25 * rate * (n - done) + 64)))


def changes(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(indices where a != b, a there, b there), one pass over both."""
    n, w = a.size, a.itemsize
    if b.dtype != a.dtype or b.size != n:
        raise ValueError("changes needs two arrays of one dtype and size")
    a, b = np.ascontiguousarray(a), np.ascontiguousarray(b)
    parts, start, found = [], 0, 0
    cap = min(n, max(1024, n // 16)) + 8  # to 6% changed in one go (untouched pages cost nothing)
    while True:
        pos, va, vb = np.empty(cap, np.int64), np.empty(cap, a.dtype), np.empty(cap, a.dtype)
        count, start = lib.changes(w, a, b, start, pos, va, vb)
        found += count
        parts.append((pos[:count], va[:count], vb[:count]))
        if start >= n:
            break
        cap = _grow(n, found, start) + 8
    if len(parts) == 1:
        return parts[0]
    return tuple(np.concatenate(x) for x in zip(*parts))


def bf16_changes(a: np.ndarray, b: np.ndarray):
    """(indices where the bf16 casts of two float32 arrays differ, a's cast there, b's cast
    there: uint16 bits), one pass over both; None where either holds a NaN. The casts are
    torch's (round to nearest even) for every other value (tests/weights/test_native.py)."""
    n = a.size
    if a.dtype != np.float32 or b.dtype != np.float32 or b.size != n:
        raise ValueError("bf16_changes needs two float32 arrays of one size")
    a, b = np.ascontiguousarray(a), np.ascontiguousarray(b)
    parts, start, found = [], 0, 0
    cap = min(n, max(1024, n // 16)) + 40
    while True:
        pos, va, vb = np.empty(cap, np.int64), np.empty(cap, np.uint16), np.empty(cap, np.uint16)
        count, start = lib.bf16_changes(a, b, start, pos, va, vb)
        if start < 0:
            return None
        found += count
        parts.append((pos[:count], va[:count], vb[:count]))
        if start >= n:
            break
        cap = _grow(n, found, start) + 40
    if len(parts) == 1:
        return parts[0]
    return tuple(np.concatenate(x) for x in zip(*parts))


def small_positions(a: np.ndarray, bound: int) -> np.ndarray:
    """Sorted indices of the elements whose magnitude bits are below `bound`."""
    n = a.size
    mag = int(np.iinfo(a.dtype).max >> 1)
    a = np.ascontiguousarray(a)
    parts, start, found = [], 0, 0
    cap = min(n, 1 << 16)
    while True:
        pos = np.empty(max(cap, 1), np.int64)
        count, start = lib.small(a.itemsize, a, mag, bound, start, pos)
        found += count
        parts.append(pos[:count])
        if start >= n:
            break
        cap = _grow(n, found, start)
    return parts[0] if len(parts) == 1 else np.concatenate(parts)


def change_sum(keys: np.ndarray, packed: bool, pos: np.ndarray, old: np.ndarray,
               new: np.ndarray) -> np.ndarray:
    """The additive hash's movement (LANES=2 uint64) from changes at pos, old -> new."""
    pos = np.ascontiguousarray(pos, np.int64)
    s0, s1 = lib.change_sum(keys, old.itemsize, int(packed), pos, np.ascontiguousarray(old),
                            np.ascontiguousarray(new))
    return np.array([s0, s1], np.uint64)


def rice_encode(v: np.ndarray, k: int) -> tuple[bytes, bytes, bytes, int]:
    return lib.rice_encode(np.ascontiguousarray(v, np.uint64), k)


def rice_decode(unary, low, escaped, n: int, k: int) -> np.ndarray:
    out = np.empty(n, np.uint64)
    lib.rice_decode(unary, low, escaped, k, out)
    return out


def apply_keys(a: np.ndarray, pos: np.ndarray, kd: np.ndarray, is_float: bool,
               keys: np.ndarray | None, packed: bool, offset: int) -> np.ndarray:
    """a[pos] = unkey(key(a[pos]) + kd) in place (key: entropy.float_key for floats, else
    none), and the additive hash's movement of those writes at pos + offset (zero without
    `keys`). ValueError for a position outside `a`, before any write."""
    s0, s1 = lib.apply_keys(a.itemsize, int(is_float), a, np.ascontiguousarray(pos, np.int64),
                            np.ascontiguousarray(kd, a.dtype),
                            b"" if keys is None else keys, int(packed), offset)
    return np.array([s0, s1], np.uint64)


def tiered_split(S: np.ndarray, pos: np.ndarray, a_pos: np.ndarray, b_pos: np.ndarray,
                 threshold: int, mbits: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """tiered.encode's reordering: (S's changed elements' indices in S, R's ranks among the
    positions not in S, the value planes: uint8, W rows of n)."""
    n, w = pos.size, a_pos.itemsize
    ranks_s, ranks_r = np.empty(n, np.int64), np.empty(n, np.int64)
    planes = np.empty((w, n), np.uint8)
    n_s = lib.tiered_split(w, mbits, threshold, np.ascontiguousarray(S, np.int64),
                           np.ascontiguousarray(pos, np.int64), np.ascontiguousarray(a_pos),
                           np.ascontiguousarray(b_pos), ranks_s, ranks_r, planes)
    return ranks_s[:n_s], ranks_r[: n - n_s], planes


def tiered_join(a: np.ndarray, S: np.ndarray, pos_s: np.ndarray, r: np.ndarray, planes,
                threshold: int, mbits: int) -> tuple[np.ndarray, np.ndarray]:
    """tiered.decode's reordering: (S's changed positions then the r-th positions not in S,
    their key differences from the planes). ValueError for a position outside `a`."""
    n = pos_s.size + r.size
    pos, kd = np.empty(n, np.int64), np.empty(n, a.dtype)
    lib.tiered_join(a.itemsize, mbits, threshold, np.ascontiguousarray(a),
                    np.ascontiguousarray(S, np.int64), np.ascontiguousarray(pos_s, np.int64),
                    np.ascontiguousarray(r, np.int64), planes, pos, kd)
    return pos, kd


def plan(a: np.ndarray, e_changed: np.ndarray, mbits: int, sample: int, price: float,
         scan: float, min_gain: float) -> tuple[int, np.ndarray | None]:
    """tiered.plan with its listing pass (read-only S)."""
    best, S = lib.plan(a.itemsize, mbits, np.ascontiguousarray(a),
                       np.ascontiguousarray(e_changed, a.dtype), sample, price, scan, min_gain)
    return best, None if S is None else np.frombuffer(S, np.int64)
