"""One writer per run directory: a lock taken before a run (new or resumed) writes anything.

`fcntl.flock` on `RUN_DIR/run.lock`, which the kernel drops however its holder exits, so a dead
run never blocks `--resume`. The file holds a JSON record (host, pid and its start time,
command, a heartbeat every `HEARTBEAT_S`) for filesystems that ignore flock: a live pid on this
host, or another host's heartbeat younger than `STALE_BEATS`, refuses with `RunDirInUse`
(the CLI exits 2); an older record is taken over.
Limits: cross-host checks compare wall clocks (hosts need NTP); a holder whose heartbeat
thread stalls 15 s looks dead to other hosts; two hosts reading a stale record at once can
both take it over. Spawned engines and ranks never inherit the lock (close-on-exec).
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import sys
import threading
import time
from pathlib import Path

LOCK_NAME = "run.lock"
HEARTBEAT_S = 5.0
STALE_BEATS = 3  # a record from another host whose heartbeat is older than this many beats is gone
RECORD_BYTES = 1024  # the record's fixed length on disk (longer records are written whole)


class RunDirInUse(FileExistsError):
    """Another live run holds the run directory; the message names it and the fix."""


def _proc_start(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (Linux /proc), or None."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def _alive(pid: int, start: str | None) -> bool:
    """Is `pid` the process that wrote the record (not a later process given the same pid)?"""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # a live process of another user
        return True
    now = _proc_start(pid)
    return start is None or now is None or now == start


def _describe(run_dir: Path, rec: dict) -> str:
    since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(rec.get("since", 0)))
    return (f"run directory {run_dir} is in use by pid {rec.get('pid')} on host "
            f"{rec.get('host')} since {since} ({rec.get('command', '?')})")


class RunLock:
    """The held lock of one run directory; `release()` (idempotent) frees it."""

    def __init__(self, run_dir: Path, fd: int, heartbeat_s: float):
        self.run_dir, self.path, self._fd = run_dir, run_dir / LOCK_NAME, fd
        self.record = {"host": socket.gethostname(), "pid": os.getpid(),
                       "pid_start": _proc_start(os.getpid()), "since": time.time(),
                       "command": " ".join([Path(sys.argv[0]).name] + sys.argv[1:])[:200],
                       "heartbeat": time.time()}
        self._write()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, args=(heartbeat_s,), daemon=True,
                                        name=f"traingym-runlock-{run_dir.name}")
        self._thread.start()

    def _write(self) -> None:
        self.record["heartbeat"] = time.time()
        # Padded to a fixed length and written in place: a reader never sees an empty or a
        # half-shortened record (json.loads ignores the trailing spaces).
        data = json.dumps(self.record).ljust(RECORD_BYTES).encode()
        os.pwrite(self._fd, data, 0)
        os.ftruncate(self._fd, len(data))
        os.fsync(self._fd)

    def _beat(self, every: float) -> None:
        while not self._stop.wait(every):
            try:
                self._write()
            except OSError as e:  # the run goes on; other hosts may then see it as gone
                print(f"traingym: warning: cannot refresh the heartbeat in "
                      f"{self.run_dir / LOCK_NAME} ({e}); a run on another host may take this "
                      "run directory over", file=sys.stderr)
                return

    @property
    def held(self) -> bool:
        return self._fd >= 0

    def release(self) -> None:
        if self._fd < 0:
            return
        self._stop.set()
        self._thread.join()
        os.ftruncate(self._fd, 0)
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        os.close(self._fd)
        self._fd = -1

    def __enter__(self) -> RunLock:
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def _read(fd: int) -> dict | None:
    data = os.pread(fd, 1 << 16, 0)
    if not data.strip():
        return None
    try:
        rec = json.loads(data)
    except json.JSONDecodeError:
        rec = None
    if not isinstance(rec, dict) or "pid" not in rec:
        return {"unreadable": data[:80].decode(errors="replace")}
    return rec


def _refusal(run_dir: Path, rec: dict | None, flock_held: bool,
             stale_s: float) -> tuple[str | None, str | None]:
    """(why the run directory is in use, or None; a warning to print when taking it over)."""
    busy = f"run directory {run_dir} is in use by another process; wait for it or stop it"
    if rec is not None and "unreadable" in rec:
        return (busy if flock_held else
                f"{run_dir / LOCK_NAME} holds an unreadable record ({rec['unreadable']!r}); "
                "if no run uses this directory, delete that file"), None
    if flock_held:  # rec None: the holder has the flock but has not written its record yet
        return (busy if rec is None else f"{_describe(run_dir, rec)}; wait for it or stop it"), None
    if rec is None:
        return None, None
    if rec.get("host") == socket.gethostname():
        if rec["pid"] != os.getpid() and _alive(int(rec["pid"]), rec.get("pid_start")):
            return (f"{_describe(run_dir, rec)} (this filesystem does not honour flock); wait "
                    "for it or stop it"), None
        return None, None
    age = time.time() - float(rec.get("heartbeat", 0))
    if age < stale_s:
        return (f"{_describe(run_dir, rec)}; its heartbeat is {age:.0f} s old (a run on "
                f"another host; it counts as gone after {stale_s:.0f} s without one); wait for "
                "it or stop it"), None
    return None, (f"traingym: warning: taking over {run_dir}: its lock names pid {rec['pid']} "
                  f"on host {rec.get('host')}, whose heartbeat stopped {age:.0f} s ago")


def acquire(run_dir: Path, heartbeat_s: float = HEARTBEAT_S,
            stale_s: float | None = None) -> RunLock:
    """Take `run_dir`'s lock (creating the folder) or raise RunDirInUse naming the holder."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(run_dir / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        flock_held = False
    except BlockingIOError:
        flock_held = True
    reason, warning = _refusal(run_dir, _read(fd), flock_held,
                               STALE_BEATS * heartbeat_s if stale_s is None else stale_s)
    if reason is not None:
        os.close(fd)  # closing drops our flock, if we got it
        raise RunDirInUse(reason)
    if warning:
        print(warning, file=sys.stderr)
    return RunLock(run_dir, fd, heartbeat_s)
