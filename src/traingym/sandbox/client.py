"""Host side of a sandbox: start the agent (inside whatever the backend wraps it in) and talk to it.

The agent is untrusted once candidate code has run next to it, so the host reads its frames with
size caps, enforces its own deadline (the execution's wall limit plus a grace period) and, when
the agent misbehaves or dies, kills the whole sandbox and marks it broken (`SandboxError` on
later calls). Only one operation runs at a time per sandbox.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import struct
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from traingym.sandbox.base import Command, ExecResult, Limits, SandboxError

HEADER = struct.Struct("!II")
BLOB = struct.Struct("!Q")
AGENT_SOURCE = (Path(__file__).parent / "agent.py").read_text()
GRACE_S = 5.0  # host deadline beyond the agent's own wall-clock limit
START_TIMEOUT_S = 30.0


def agent_argv(python: str, workspace: str, pidns: bool, wipe_dirs: Sequence[str]) -> list[str]:
    mode = "--pidns" if pidns else "--no-pidns"
    return [python, "-I", "-B", "-c", AGENT_SOURCE, workspace, mode, *wipe_dirs]


def check_command(command: Command) -> None:
    if isinstance(command, str):
        return
    if isinstance(command, bytes) or not isinstance(command, Sequence) or not command:
        raise TypeError(f"command must be Python source (str) or a non-empty argv, got {command!r}")
    for arg in command:
        if not isinstance(arg, str) or "\0" in arg:
            raise TypeError(f"argv entries must be str without NUL bytes, got {arg!r}")


class AgentSandbox:
    """A Sandbox whose executions are run by an agent process started with `argv`.

    Backends subclass it and supply `argv`, an optional `preexec` for the child (cgroup entry),
    the per-execution rlimits (`rlimits_for`) and `before_exec`/`cleanup` hooks.
    """

    backend = "agent"

    def __init__(self, argv: list[str], limits: Limits, preexec: Callable[[], None] | None = None):
        self.argv = argv
        self.limits = limits
        self.preexec = preexec
        self.proc: asyncio.subprocess.Process | None = None
        self.broken: str | None = None
        self.lock = asyncio.Lock()
        self.executions = 0
        self.ready_s: float | None = None
        self.env = {"PATH": "/usr/bin:/bin"}  # the agent process's environment on the host
        self.cwd: str | None = None

    async def start(self) -> AgentSandbox:
        t0 = time.monotonic()
        self.proc = await asyncio.create_subprocess_exec(
            *self.argv,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            preexec_fn=self.preexec,
            env=self.env,
            cwd=self.cwd,
            start_new_session=True,
            limit=1 << 16,
        )
        header, _ = await self._receive(START_TIMEOUT_S, 1 << 10)
        if header.get("op") != "ready":
            await self._break(f"agent did not start: {header}")
        self.ready_s = time.monotonic() - t0
        return self

    def rlimits_for(self, limits: Limits) -> dict:
        """Required of every backend: the rlimits the agent sets in each execution's child."""
        raise NotImplementedError(f"{type(self).__name__} must define rlimits_for(limits)")

    def before_exec(self, limits: Limits) -> None:
        """Hook: set limits that live outside the agent (cgroups)."""

    def classify(self, result: ExecResult) -> None:
        """Hook: add what only the host can see (e.g. OOM kills) to a result."""

    async def exec(
        self,
        command: Command,
        *,
        stdin: bytes = b"",
        files: Mapping[str, bytes] | None = None,
        limits: Limits | None = None,
    ) -> ExecResult:
        check_command(command)
        if not isinstance(stdin, bytes):
            raise TypeError(f"stdin must be bytes, got {type(stdin).__name__}")
        limits = limits or self.limits
        files = dict(files or {})
        for path, data in files.items():
            if not isinstance(path, str) or not isinstance(data, bytes):
                raise TypeError(f"files maps str paths to bytes, got {path!r}: {type(data)}")
        req = {
            "op": "exec",
            "argv": None if isinstance(command, str) else list(command),
            "code": command if isinstance(command, str) else None,
            "limits": {"wall_s": limits.wall_s, "output_bytes": limits.output_bytes}
            | self.rlimits_for(limits),
            "files": [[p, len(d)] for p, d in files.items()],
        }
        async with self.lock:
            self._check_usable()
            self.before_exec(limits)
            t0 = time.monotonic()
            await self._send(req, [stdin, *files.values()])
            cap = 2 * limits.output_bytes + (1 << 16)
            try:
                header, blobs = await self._receive(limits.wall_s + GRACE_S, cap)
            except SandboxError as exc:
                result = ExecResult(
                    None, None, b"", b"", False, False, time.monotonic() - t0, None,
                    "sandbox", self.backend, error=str(exc), events=[f"sandbox broke: {exc}"],
                )
                self.classify(result)
                return result
            self.executions += 1
        if not header.get("ok"):
            raise ValueError(header.get("error"))
        result = ExecResult(
            exit_code=header["exit_code"],
            signal=header["signal"],
            stdout=blobs[0],
            stderr=blobs[1],
            truncated=header["truncated"],
            timed_out=header["killed_reason"] == "wall",
            wall_s=header["wall_s"],
            cpu_s=header["cpu_s"],
            killed_reason=header["killed_reason"],
            backend=self.backend,
            max_rss_bytes=header["max_rss_bytes"],
            error=header.get("exec_error"),
        )
        if result.killed_reason:
            result.events.append(f"limit hit: {result.killed_reason}")
        if result.signal:
            result.events.append(f"killed by signal {signal.Signals(result.signal).name}")
        self.classify(result)
        return result

    async def write_file(self, path: str, data: bytes) -> None:
        if not isinstance(data, bytes):
            raise TypeError(f"data must be bytes, got {type(data).__name__}")
        await self._call({"op": "write", "path": path}, [data], 1 << 10)

    async def read_file(self, path: str, max_bytes: int = 16 << 20) -> bytes:
        _, blobs = await self._call({"op": "read", "path": path, "max_bytes": max_bytes}, [],
                                    max_bytes + (1 << 10))
        return blobs[0]

    async def reset(self) -> None:
        """Kill leftovers and wipe the writable directories: the session is as new."""
        await self._call({"op": "reset"}, [], 1 << 10)

    async def close(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self._kill()
            await self.proc.wait()
        self.broken = self.broken or "closed"

    @property
    def alive(self) -> bool:
        return self.broken is None and self.proc is not None and self.proc.returncode is None

    # -- plumbing -------------------------------------------------------------------------

    async def _call(self, req: dict, blobs: list[bytes], cap: int) -> tuple[dict, list[bytes]]:
        async with self.lock:
            self._check_usable()
            await self._send(req, blobs)
            header, out = await self._receive(30.0, cap)
        if not header.get("ok"):
            raise ValueError(header.get("error"))
        return header, out

    def _check_usable(self) -> None:
        if self.broken is not None:
            raise SandboxError(f"{self.backend} sandbox is not usable: {self.broken}")

    async def _send(self, header: dict, blobs: list[bytes]) -> None:
        body = json.dumps(header).encode()
        parts = [HEADER.pack(len(body), len(blobs)), body]
        for blob in blobs:
            parts += [BLOB.pack(len(blob)), blob]
        self.proc.stdin.write(b"".join(parts))
        try:
            await self.proc.stdin.drain()
        except (BrokenPipeError, ConnectionResetError) as exc:
            await self._break(f"agent gone: {exc}")

    async def _receive(self, timeout: float, cap: int) -> tuple[dict, list[bytes]]:
        try:
            return await asyncio.wait_for(self._read_frame(cap), timeout)
        except TimeoutError:
            await self._break(f"agent did not answer within {timeout:.1f} s")
        except (asyncio.IncompleteReadError, ValueError, UnicodeDecodeError) as exc:
            await self._break(f"bad frame from agent: {type(exc).__name__}: {exc}")

    async def _read_frame(self, cap: int) -> tuple[dict, list[bytes]]:
        read = self.proc.stdout.readexactly
        n_header, n_blobs = HEADER.unpack(await read(HEADER.size))
        if n_header > 1 << 16 or n_blobs > 2:
            raise ValueError(f"frame header {n_header} bytes, {n_blobs} blobs")
        header = json.loads(await read(n_header))
        if not isinstance(header, dict):
            raise ValueError("frame header is not an object")
        blobs, total = [], 0
        for _ in range(n_blobs):
            (size,) = BLOB.unpack(await read(BLOB.size))
            total += size
            if total > cap:
                raise ValueError(f"agent sent {total} bytes, more than the cap {cap}")
            blobs.append(await read(size))
        return header, blobs

    async def _break(self, why: str) -> None:
        stderr = b""
        if self.proc is not None:
            self._kill()
            await self.proc.wait()
            stderr = await self.proc.stderr.read(4096)
        self.broken = why
        detail = f"; agent stderr: {stderr.decode(errors='replace').strip()}" if stderr else ""
        raise SandboxError(f"{self.backend} sandbox broke: {why}{detail}")

    def _kill(self) -> None:
        """SIGKILL the agent's session on the host (bwrap: its pid namespace dies with it)."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass  # already gone


def host_python() -> str:
    """The interpreter the agent runs on: this process's base installation (stdlib only)."""
    base = Path(sys.base_prefix) / "bin" / f"python{sys.version_info.major}.{sys.version_info.minor}"
    if not base.exists():
        raise FileNotFoundError(f"no interpreter at {base}")
    return str(base)
