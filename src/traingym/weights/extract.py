"""Finding the elements that changed between two states of one tensor (the delta codec's
first step, codecs.py): `changes` compares two arrays of bits 8 bytes at a time;
`cast_changes` compares the last published cast with the trainer's tensor cast a cache-sized
chunk at a time, so no cast copy of the model is made (Publisher.publish's `cast`);
`changes_at` reads only the positions the optimizer step named (base.Changed)."""

from __future__ import annotations

import numpy as np
import torch

from traingym.weights import native, tiered
from traingym.weights.hashing import bits


def changes(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(indices where a != b, a there, b there). Compares 8 bytes at a time; the lanes that
    differ within a changed word, and their old and new values, come from the two gathered
    words (no second gather from the large arrays). With the C kernels, one pass (native.py)."""
    if native.lib is not None:
        return native.changes(a, b)
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


CAST_CHUNK = 1 << 19  # elements cast and compared at a time (2 MB of fp32: in L2/L3)


def cast_changes(master: torch.Tensor, old: np.ndarray, dtype: torch.dtype):
    """`changes(old, bits(master cast to dtype))` without the cast copy: `master` (flat,
    contiguous, any dtype) is cast a chunk at a time into a buffer that stays in cache and
    compared there with `old`, the bits of the last published cast. One read of each."""
    n = master.numel()
    if n != old.size:
        raise ValueError(f"master has {n} elements, the published state {old.size}")
    buf = torch.empty(min(n, CAST_CHUNK), dtype=dtype)
    nb = bits(buf)
    found = []
    for i in range(0, n, CAST_CHUNK):
        k = min(CAST_CHUNK, n - i)
        buf[:k].copy_(master[i : i + k])
        pos, a_pos, b_pos = changes(old[i : i + k], nb[:k])
        if pos.size:
            found.append((pos + i, a_pos, b_pos))
    if not found:
        return np.zeros(0, np.int64), old[:0].copy(), old[:0].copy()
    return tuple(np.concatenate(x) for x in zip(*found))


def changes_at(master: torch.Tensor, old: np.ndarray, dtype: torch.dtype | None,
               positions: np.ndarray | None, start: int = 0, values=None):
    """`cast_changes` (or `changes`, with dtype None) read at the sorted flat `positions` of the
    whole tensor (None: none) that fall in this piece, [start, start + old.size): O(positions),
    the rest of the piece is taken as unchanged; `values` (old bits, new bits there, aligned
    with `positions`) spares reading both states. Positions whose value is the same are
    dropped."""
    if positions is None or positions.size == 0:
        return np.zeros(0, np.int64), old[:0].copy(), old[:0].copy()
    lo, hi = np.searchsorted(positions, [start, start + old.size])
    pos = positions[lo:hi] - start
    if pos.size and (pos[0] < 0 or pos[-1] >= old.size):
        raise ValueError("changed positions out of range")
    if values is not None:
        a_pos, b_pos = (v[lo:hi].view(old.dtype) for v in values)
    else:
        a_pos = np.take(old, pos)
        new = torch.index_select(master, 0, torch.from_numpy(pos))
        b_pos = bits(new.to(dtype) if dtype is not None else new)
    keep = a_pos != b_pos
    if keep.all():  # as the optimizer step reports them: no copies
        return pos, a_pos, b_pos
    return pos[keep], a_pos[keep], b_pos[keep]


def changed_positions(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Indices where a != b (sorted)."""
    return changes(a, b)[0]
