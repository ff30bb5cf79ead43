"""Helpers for the adversarial sandbox suite: every case runs against each backend meant to
contain it, and is skipped with the reason where the backend is not (`skip_unless`). A backend
that cannot start here skips every test of it, naming why; under CI an unavailable bwrap (the
default backend) fails them instead (`backend`, tests/prereq.py)."""

from __future__ import annotations

import asyncio
import os
import time

import pytest
from prereq import require_sandbox

from traingym.sandbox import Limits, open_sandbox

MiB = 1 << 20
SMALL = Limits(cpu_s=2, wall_s=5, memory_bytes=256 * MiB, processes=32, file_bytes=16 * MiB,
               output_bytes=1 * MiB)

NOT_A_BOUNDARY = "the process backend is not a security boundary: "


def run(backend: str, body, limits: Limits = SMALL, **options):
    """Open a sandbox of `backend`, await body(sandbox), close it; return body's value."""

    async def main():
        options_ = dict(options)
        if backend == "bwrap":
            options_.setdefault("scratch_bytes", 16 * MiB)
        sandbox = await open_sandbox(backend, limits, **options_)
        try:
            return await body(sandbox)
        finally:
            await sandbox.close()

    return asyncio.run(main())


async def assert_reusable(sandbox) -> None:
    """The slot still works after the attack: a clean run succeeds."""
    result = await sandbox.exec("print('still here')")
    assert result.ok, result
    assert result.stdout == b"still here\n"


def skip_unless(backend: str, contained_by: tuple[str, ...], reason: str) -> None:
    if backend not in contained_by:
        pytest.skip(reason)


@pytest.fixture(params=["bwrap", "process"])
def backend(request):
    """The backend under test; unavailable here, it skips with the reason (fails under CI for
    the default backend, bwrap: tests/prereq.py)."""
    require_sandbox(request.param, SMALL)
    return request.param


def _parent(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def _descendants_of(root: int) -> list[int]:
    """Live processes below `root` (other people's sandboxes on this machine are not ours)."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        pid = int(name)
        try:
            chain = pid
            while chain > 1:
                chain = _parent(chain)
                if chain == root:
                    found.append(pid)
                    break
        except (FileNotFoundError, ProcessLookupError):
            continue  # exited while we looked
    return found


@pytest.fixture(autouse=True)
def _no_leftovers():
    """No process this test started survives it (fork bombs, daemons, agents). Processes
    that were there before it (e.g. multiprocessing's resource tracker, started by earlier
    tests in the same pytest process) are not its doing."""
    before = set(_descendants_of(os.getpid()))
    yield

    def new() -> list[int]:
        return [p for p in _descendants_of(os.getpid()) if p not in before]

    leftovers = new()
    for _ in range(50):  # a killed namespace takes a moment to disappear
        if not leftovers:
            break
        time.sleep(0.02)
        leftovers = new()
    assert not leftovers, f"processes left behind: {leftovers}"
