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


def state_hash(state: dict[str, torch.Tensor]) -> str:
    h = xxhash.xxh3_128()
    for name in sorted(state):
        t = state[name]
        h.update(f"{name}|{dtype_name(t.dtype)}|{tuple(t.shape)}|".encode())
        h.update(bits(t).data)
    return h.hexdigest()


def buffers_hash(buffers) -> str:
    h = xxhash.xxh3_128()
    for b in buffers:
        h.update(f"{len(b)}|".encode())
        h.update(b)
    return h.hexdigest()


def bytes_hash(data) -> bytes:
    return xxhash.xxh3_128(data).digest()
