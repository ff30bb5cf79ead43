"""Giving freed memory back to the system between the phases of a step.

glibc's allocator keeps freed blocks of the sizes activations come in (up to its dynamic
mmap threshold, 32 MiB) in its arenas, one per thread that allocated; a step's shapes change
from phase to phase, so the holes add up and the process's resident size grows past what it
holds (measured: benchmarks/memory_phases.py). `trim()` returns whole free pages
(malloc_trim(0)) at a phase edge: a few milliseconds, then the next phase faults in the pages
it needs. No-op where the C library has no malloc_trim (musl, macOS).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools


@functools.cache
def _malloc_trim():
    name = ctypes.util.find_library("c")
    try:
        fn = ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):
        return None
    if fn is not None:
        fn.argtypes, fn.restype = [ctypes.c_size_t], ctypes.c_int
    return fn


def trim() -> None:
    """Return the allocator's free pages to the system (glibc); else nothing."""
    fn = _malloc_trim()
    if fn is not None:
        fn(0)
