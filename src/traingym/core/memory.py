"""Giving freed memory back to the system between the phases of a step, and huge pages.

glibc's allocator keeps freed blocks of the sizes activations come in (up to its dynamic
mmap threshold, 32 MiB) in its arenas, one per thread that allocated; a step's shapes change
from phase to phase, so the holes add up and the process's resident size grows past what it
holds (measured: benchmarks/memory_phases.py). `trim()` returns whole free pages
(malloc_trim(0)) at a phase edge: a few milliseconds, then the next phase faults in the pages
it needs. No-op where the C library has no malloc_trim (musl, macOS).

Every page the process touches for the first time, or again after a trim, is a page fault: on
the 2-vCPU VMs this project measures on, a train step of benchmarks/vs_trl.py's batch faulted
about 0.87M 4 KiB pages, a quarter of its CPU time in the kernel. `huge_pages` asks torch to
back its CPU tensors of 2 MiB and more with transparent huge pages (one fault per 2 MiB);
see BENCHMARKS.md ("Page faults") for what it changes.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os

TORCH_THP = "THP_MEM_ALLOC_ENABLE"  # c10/core/alloc_cpu.cpp, read at torch's first CPU allocation


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


def huge_pages(on: bool) -> bool:
    """Ask torch to madvise this process's CPU allocations of 2 MiB and more as transparent
    huge pages (`on`), or not. torch reads its switch (the THP_MEM_ALLOC_ENABLE variable) once,
    at the process's first CPU allocation: this sets it, makes that allocation, and takes the
    variable out of the environment again, so child processes (a user's own tools) keep
    torch's default. Call it before any model is made (loop/build.py does, first thing); after
    torch's first allocation it changes nothing. A THP_MEM_ALLOC_ENABLE the user set wins.
    Returns whether the kernel grants huge pages on request (its THP mode is `always` or
    `madvise`); if it does not, the switch changes nothing."""
    if TORCH_THP not in os.environ:
        import torch

        os.environ[TORCH_THP] = "1" if on else "0"
        try:
            torch.empty(1)  # torch's first CPU allocation reads the switch, if none did before
        finally:
            del os.environ[TORCH_THP]
    return thp_mode() in ("always", "madvise")


def thp_mode() -> str | None:
    """The kernel's transparent-huge-page mode (always, madvise, never), or None (not Linux)."""
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            text = f.read()
    except OSError:
        return None
    start, end = text.find("["), text.find("]")
    return text[start + 1:end] if 0 <= start < end else None
