"""Sandboxes for model-written code: backends by explicit name, and a warm pool.

`open_sandbox("bwrap")` is the default on Linux; `open_sandbox("process")` is NOT a security
boundary and is only ever used when named. A backend that cannot run raises SandboxUnavailable:
there is no fallback to another backend. `BACKENDS` is the Registry (core/registry.py) of
backend classes (each with an async `create(limits, **options)`); a "module:Class" path names
one outside it.
The code runs against an image (images.py): `open_sandbox("bwrap", image={"requirements":
["numpy"]})`; none given, the standard library only.
"""

from __future__ import annotations

from traingym.core.registry import Registry
from traingym.sandbox.base import (
    ExecResult,
    Limits,
    Sandbox,
    SandboxError,
    SandboxUnavailable,
)
from traingym.sandbox.images import ImageSpec, get_image


def _backend(name: str, cls):
    if not (isinstance(cls, type) and callable(getattr(cls, "create", None))):
        raise TypeError("not a sandbox class (one with an async classmethod create)")
    return cls


BACKENDS = Registry("sandbox backend", {
    "bwrap": "traingym.sandbox.bwrap:BwrapSandbox",
    "process": "traingym.sandbox.process:ProcessSandbox",
}, check=_backend)
DEFAULT_BACKEND = "bwrap"


async def open_sandbox(backend: str, limits: Limits | None = None, **options) -> Sandbox:
    """Start one sandbox of the named backend ("bwrap" or "process"); options: `image` (an
    ImageSpec, its mapping or a built Image), and the backend's own (bwrap: scratch_bytes).
    Only the named backend is tried; an unknown name is a RegistryError (a ValueError)."""
    return await BACKENDS.get(backend).create(limits, **options)


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
