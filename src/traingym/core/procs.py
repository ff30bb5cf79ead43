"""Helpers for the server processes traingym starts (the vLLM worker, the SGLang server, an
OpenEnv server): a free local port, stopping a process group, the tail of a log, and waiting
for an HTTP health URL to answer.

Each server is started with `start_new_session=True`, so its process group holds it and
whatever it started; `stop_group` signals that group. `wait_healthy` probes with the standard
library (no httpx needed) and takes any 2xx answer, whatever its body (rollout/http.py's
HttpClient wants a JSON body, which a health route need not send).
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path


def free_port(host: str = "127.0.0.1") -> int:
    """A port on `host` that was free a moment ago (another process may take it first)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def stop_group(proc: subprocess.Popen | None, term_s: float, kill_s: float) -> None:
    """SIGTERM the process group of `proc`, wait up to `term_s` for `proc`; then SIGKILL it,
    wait up to `kill_s`. Once `proc` has exited (or when it already had), the group gets a
    SIGKILL too, for members that outlive it (a crashed launcher's workers, a child that
    ignores SIGTERM). Never waits longer than term_s + kill_s (a process that survives
    SIGKILL that long is left to the system); returns at once when `proc` is None."""
    if proc is None:
        return
    if proc.poll() is None:
        for sig, wait_s in ((signal.SIGTERM, term_s), (signal.SIGKILL, kill_s)):
            try:
                os.killpg(proc.pid, sig)
                proc.wait(timeout=wait_s)
                break
            except subprocess.TimeoutExpired:
                continue
            except ProcessLookupError:
                return
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # what is left of the group
    except (ProcessLookupError, PermissionError):
        pass


def log_tail(path: Path | None, lines: int | None = None, chars: int | None = None,
             missing: str = "(no log)") -> str:
    """The last `lines` lines (or last `chars` characters) of a log file; `missing` when it
    cannot be read."""
    try:
        text = Path(path).read_text(errors="replace") if path is not None else None
    except OSError:
        text = None
    if text is None:
        return missing
    if chars is not None:
        return text[-chars:]
    return "\n".join(text.splitlines()[-lines:] if lines else text.splitlines())


class NotHealthy(RuntimeError):
    """`wait_healthy` gave up: `exited` (the process's exit code) or timed out (`exited` is
    None); `last_error` is the last probe's failure."""

    def __init__(self, url: str, exited: int | None, last_error: str):
        super().__init__(f"{url}: " + (f"the process exited with code {exited}"
                                       if exited is not None else last_error))
        self.exited, self.last_error = exited, last_error


def probe(url: str, timeout_s: float) -> str | None:
    """None when GET `url` answers 2xx within `timeout_s`, else what went wrong."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as r:
            r.read(1 << 16)
        return None
    except (urllib.error.URLError, OSError) as e:
        return str(e)


def _healthy(url: str, proc, deadline: float, probe_s: float) -> bool:
    """One round of wait_healthy: True when answered, False to try again, NotHealthy when
    the process exited or the deadline passed."""
    if proc is not None and proc.poll() is not None:
        raise NotHealthy(url, proc.returncode, "")
    error = probe(url, probe_s)
    if error is not None and time.monotonic() > deadline:
        raise NotHealthy(url, None, error)
    return error is None


def wait_healthy(url: str, proc: subprocess.Popen | None, timeout_s: float,
                 interval_s: float = 0.2, probe_s: float = 2.0) -> None:
    """Probe `url` every `interval_s` until it answers 2xx; raise NotHealthy when `proc` (if
    given) exits first or nothing answered within `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not _healthy(url, proc, deadline, probe_s):
        time.sleep(interval_s)


async def wait_healthy_async(url: str, proc: subprocess.Popen | None, timeout_s: float,
                             interval_s: float = 0.2, probe_s: float = 2.0) -> None:
    """`wait_healthy` for async callers: each probe in a worker thread, the event loop free
    (and the wait cancellable) between them."""
    deadline = time.monotonic() + timeout_s
    while not await asyncio.to_thread(_healthy, url, proc, deadline, probe_s):
        await asyncio.sleep(interval_s)
