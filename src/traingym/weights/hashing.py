"""Hashes of states and payloads, and zero-copy views of tensor bits.

xxh3-128 detects corruption and mix-ups of versions at memory speed; it does not resist an adversary
who forges payloads (use an authenticated channel for that). A state hash covers every tensor's
name, dtype, shape and bytes, in sorted name order.
"""

from __future__ import annotations

import numpy as np
import torch
import xxhash

_UINT = {1: (torch.uint8, np.uint8), 2: (torch.int16, np.uint16),
         4: (torch.int32, np.uint32), 8: (torch.int64, np.uint64)}


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def dtype_of(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown dtype {name!r}")
    return dtype


def bits(t: torch.Tensor) -> np.ndarray:
    """The tensor's elements as unsigned integers of its width, flat, sharing memory."""
    if t.device.type != "cpu" or not t.is_contiguous():
        raise ValueError("weight sync works on contiguous CPU tensors; call .contiguous().cpu()")
    if t.dtype == torch.bool:
        return t.reshape(-1).view(torch.uint8).numpy()
    tdt, ndt = _UINT[t.element_size()]
    return t.reshape(-1).view(tdt).numpy().view(ndt)


def _tensor_head(name: str, dtype: str, shape: tuple[int, ...]) -> bytes:
    return f"{name}|{dtype}|{tuple(shape)}|".encode()


def state_hash(state: dict[str, torch.Tensor]) -> str:
    h = xxhash.xxh3_128()
    for name in sorted(state):
        t = state[name]
        h.update(_tensor_head(name, dtype_name(t.dtype), tuple(t.shape)))
        h.update(bits(t).data)
    return h.hexdigest()


def raw_state_hash(entries, buffers) -> str:
    """state_hash of the state a payload of "raw" entries holds whole (the full codec's: each
    tensor's bits in its buffers), read from those bytes instead of the state."""
    h = xxhash.xxh3_128()
    for e in sorted(entries, key=lambda e: e.name):
        if e.method != "raw" or e.span:
            raise ValueError(f"raw_state_hash: {e.name} is coded {e.method!r}, not whole raw")
        h.update(_tensor_head(e.name, e.dtype, e.shape))
        for i in e.buffers:
            h.update(buffers[i])
    return h.hexdigest()


def buffers_hash(buffers) -> str:
    h = xxhash.xxh3_128()
    for b in buffers:
        h.update(f"{len(b)}|".encode())
        h.update(b)
    return h.hexdigest()


def bytes_hash(data) -> bytes:
    return xxhash.xxh3_128(data).digest()
