"""What a test needs that this machine may lack (an optional package, a sandbox backend), and one
rule for when it is missing: locally the test skips, naming what is missing; under CI (the
environment variable CI is "true", "1" or "yes", as CI services and `CI=true bash .ci/run` set
it) the same test FAILS with that reason, because CI is meant to run it and a skip there would
read as a pass.

Imported by tests as `from prereq import require` (tests/ is on sys.path, see tests/conftest.py);
not in conftest.py itself because tests/sandbox has a conftest.py too and `import conftest`
would name either.

Not covered: legitimate skips that hold everywhere (the process backend is not a security
boundary; no GPU) call pytest.skip directly and stay skips under CI.
"""

from __future__ import annotations

import asyncio
import functools
import importlib
import os
from typing import NoReturn

import pytest

from traingym.sandbox import DEFAULT_BACKEND, Limits, SandboxUnavailable, open_sandbox


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in {"1", "true", "yes"}


def missing(reason: str, ci_must_run: bool = True) -> NoReturn:
    """This test's prerequisite is absent: skip with `reason`, or fail under CI when
    `ci_must_run`."""
    if ci_must_run and in_ci():
        pytest.fail(f"CI must run this test, but {reason}", pytrace=False)
    pytest.skip(reason, allow_module_level=True)


def require(module: str, reason: str):
    """Import and return `module`; if it is not installed, `missing(reason)`. A module that is
    installed but fails to import (a missing dependency of its own, a syntax error) raises: that
    is a broken environment, not an absent extra."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        parts = module.split(".")
        if e.name not in {".".join(parts[:i]) for i in range(1, len(parts) + 1)}:
            raise
        missing(f"{reason} ({e})")


@functools.cache
def _sandbox_problem(backend: str, limits: Limits) -> str | None:
    """Why one sandbox of `backend` cannot start here with `limits` (None: it can). Probed once
    per backend and limits in a test session."""

    async def probe() -> str | None:
        try:
            sandbox = await open_sandbox(backend, limits)
        except SandboxUnavailable as e:
            return str(e)
        await sandbox.close()
        return None

    return asyncio.run(probe())


def require_sandbox(backend: str, limits: Limits | None = None) -> None:
    """Start and close one sandbox of `backend`; if the backend is unavailable here, `missing`
    with its reason and fix. Under CI only the default backend (bwrap) must be available."""
    problem = _sandbox_problem(backend, limits or Limits())
    if problem is not None:
        missing(f"the {backend} sandbox backend is unavailable here: {problem}",
                ci_must_run=backend == DEFAULT_BACKEND)


def require_vllm_venv() -> str:
    """The vLLM venv's interpreter (rollout/vllm_engine.default_python); if it is absent,
    `missing` with the command that makes it."""
    from traingym.rollout.vllm_engine import default_python

    python = default_python()
    if not python.is_file():
        missing(f"the vLLM venv is absent ({python}): run `bash scripts/setup_vllm.sh` "
                "(or set TRAINGYM_VLLM_PYTHON)")
    return str(python)


def require_amx_kernels() -> None:
    """rollout/amx.py's kernels: not built, or turned off with TRAINGYM_NATIVE=0, is `missing`
    (CI builds them: a C compiler is in its image); a CPU without AMX-BF16 is a skip everywhere,
    as a missing GPU is (the machines CI runs on have been Intel with AMX and AMD without)."""
    from traingym.rollout import amx

    if os.environ.get("TRAINGYM_NATIVE", "1") == "0":
        missing("TRAINGYM_NATIVE=0 turns the AMX kernels off")
    if amx.lib is None:
        missing("the AMX kernels are not built (traingym/rollout/_amx.c: `pip install -e .` "
                "builds them where a C compiler is found)")
    if not amx.runs():
        pytest.skip("this CPU (or its kernel) gives no AMX-BF16: the AMX kernels do not run")
