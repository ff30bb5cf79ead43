"""Sandboxes for model-written code: backends by explicit name, and a warm pool.

`open_sandbox("bwrap")` is the default on Linux; `open_sandbox("process")` is NOT a security
boundary and is only ever used when named. A backend that cannot run raises SandboxUnavailable.
The code runs against an image (images.py): `open_sandbox("bwrap", image={"requirements":
["numpy"]})`; none given, the standard library only.
"""

from __future__ import annotations

from traingym.sandbox.base import (
    ExecResult,
    Limits,
    Sandbox,
    SandboxError,
    SandboxUnavailable,
)
from traingym.sandbox.images import ImageSpec, get_image

BACKENDS = ("bwrap", "process")
DEFAULT_BACKEND = "bwrap"


async def open_sandbox(backend: str, limits: Limits | None = None, **options) -> Sandbox:
    """Start one sandbox of the named backend ("bwrap" or "process"); options: `image` (an
    ImageSpec, its mapping or a built Image), and the backend's own (bwrap: scratch_bytes)."""
    if backend == "bwrap":
        from traingym.sandbox.bwrap import BwrapSandbox

        return await BwrapSandbox.create(limits, **options)
    if backend == "process":
        from traingym.sandbox.process import ProcessSandbox

        return await ProcessSandbox.create(limits, **options)
    raise ValueError(f"unknown sandbox backend {backend!r}; choose one of {BACKENDS}")


__all__ = [
    "BACKENDS",
    "DEFAULT_BACKEND",
    "ExecResult",
    "ImageSpec",
    "Limits",
    "Sandbox",
    "SandboxError",
    "SandboxUnavailable",
    "get_image",
    "open_sandbox",
]
