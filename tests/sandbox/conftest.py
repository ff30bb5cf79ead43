"""Helpers for the adversarial sandbox suite: every case runs against each backend meant to
contain it, and is skipped with the reason where the backend is not (see `contains`)."""

from __future__ import annotations

import asyncio
import os

import pytest

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
    return request.param


@pytest.fixture(autouse=True)
def _no_leftovers():
    """No sandbox process survives a test (fork bombs, daemons)."""
    yield
    leftovers = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read()
        except (FileNotFoundError, ProcessLookupError):
            continue  # exited while we looked
        if b"pidns" in cmd and b"read_msg" in cmd:  # an agent or a fork of one
            leftovers.append(pid)
    assert not leftovers, f"sandbox processes left behind: {leftovers}"
