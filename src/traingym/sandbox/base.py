"""The Sandbox seam: run untrusted code, get a typed result.

A `Sandbox` is one session: files written with `write_file` (or passed to `exec`) persist between
its executions, processes never do (every execution's leftovers are killed when it ends).
Backends: `bwrap` (the default on Linux, a security boundary) and `process` (rlimits and timeouts
only, NOT a security boundary, used only when asked for by name). A backend that cannot run
raises `SandboxUnavailable`; nothing ever falls back to running code on the host.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

MiB = 1 << 20


class SandboxUnavailable(RuntimeError):
    """The backend cannot run code here. The message says why and how to fix it."""

    def __init__(self, reason: str, fix: str):
        super().__init__(f"{reason}. Fix: {fix}")
        self.reason = reason
        self.fix = fix


class SandboxError(RuntimeError):
    """The sandbox broke (its agent died or spoke nonsense); it is closed and cannot be reused."""


@dataclass(frozen=True)
class Limits:
    """Per-execution limits. None means "not limited" (for `processes`, see the backend)."""

    cpu_s: float | None = 10.0  # CPU seconds of the executed process (RLIMIT_CPU)
    wall_s: float = 20.0  # wall-clock seconds; the whole process tree is killed after it
    memory_bytes: int | None = 512 * MiB  # memory of the execution (cgroup or RLIMIT_AS)
    processes: int | None = 64  # processes/threads alive at once (pids cgroup or RLIMIT_NPROC)
    file_bytes: int | None = 64 * MiB  # largest file a process may write (RLIMIT_FSIZE)
    output_bytes: int = 1 * MiB  # stdout + stderr kept; the execution is killed beyond it

    def __post_init__(self):
        for name in ("cpu_s", "memory_bytes", "processes", "file_bytes"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(f"Limits.{name} must be positive or None, got {value!r}")
        if not self.wall_s > 0:
            raise ValueError(f"Limits.wall_s must be positive, got {self.wall_s!r}")
        if not self.output_bytes > 0:
            raise ValueError(f"Limits.output_bytes must be positive, got {self.output_bytes!r}")


@dataclass
class ExecResult:
    """What one execution did.

    `killed_reason` records a limit that ended it: "wall", "cpu", "memory" (only where a memory
    cgroup enforces memory; under RLIMIT_AS an allocation simply fails), "output"; or "sandbox"
    when the sandbox itself died during the execution. `ok` is true only for a clean exit 0.
    """

    exit_code: int | None  # None when ended by a signal
    signal: int | None
    stdout: bytes
    stderr: bytes
    truncated: bool  # output went past Limits.output_bytes; stdout+stderr keep the first bytes
    timed_out: bool
    wall_s: float
    cpu_s: float | None
    killed_reason: str | None
    backend: str
    max_rss_bytes: int | None = None
    error: str | None = None  # e.g. the program could not be started ("No such file ...")
    events: list[str] = field(default_factory=list)  # limits hit, anomalies, for the record

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and self.killed_reason is None and self.error is None


Command = Sequence[str] | str  # an argument vector, or (a str) Python source run as __main__


@runtime_checkable
class Sandbox(Protocol):
    backend: str

    async def exec(
        self,
        command: Command,
        *,
        stdin: bytes = b"",
        files: Mapping[str, bytes] | None = None,
        limits: Limits | None = None,
    ) -> ExecResult: ...
    async def write_file(self, path: str, data: bytes) -> None: ...
    async def read_file(self, path: str, max_bytes: int = 16 * MiB) -> bytes: ...
    async def close(self) -> None: ...
