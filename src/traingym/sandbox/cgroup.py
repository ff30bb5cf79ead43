"""Per-sandbox cgroups for the limits rlimits cannot give: processes and memory of a whole tree.

RLIMIT_NPROC counts processes per host user and does not bind root at all, so a fork bomb run
as root (or run by many sandboxes of one user) is contained only by a pids cgroup. A memory cgroup
bounds a whole tree's memory, tmpfs pages and kernel memory (inodes) included, and reports OOM
kills. Both cgroup v1 (separate `pids` and `memory` hierarchies) and v2 (one unified hierarchy
with the controllers enabled in our subtree) are handled; `find()` returns None where neither is
writable, and the caller decides (the bwrap backend refuses a process limit it cannot enforce).
"""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass
from pathlib import Path

ROOT = Path("/sys/fs/cgroup")


def _own_path(controller: str) -> str | None:
    """Our cgroup path in the v1 hierarchy of `controller`, or the v2 path for ''."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if controllers.split(",") == [controller] or (controller == "" and controllers == ""):
            return path
    return None


def _writable_dir(path: Path) -> bool:
    return path.is_dir() and os.access(path, os.W_OK)


@dataclass(frozen=True)
class CgroupLayout:
    """Where new sandbox cgroups go: a parent dir per controller (v1), or one dir (v2)."""

    version: int
    pids_parent: Path | None
    memory_parent: Path | None


def find() -> CgroupLayout | None:
    """The writable cgroup layout here, or None. v1 is preferred where its pids hierarchy works."""
    pids = _own_path("pids")
    memory = _own_path("memory")
    pids_dir = ROOT / "pids" / pids.lstrip("/") if pids is not None else None
    mem_dir = ROOT / "memory" / memory.lstrip("/") if memory is not None else None
    if pids_dir is not None and _writable_dir(pids_dir) and (pids_dir / "cgroup.procs").exists():
        mem_ok = mem_dir is not None and _writable_dir(mem_dir)
        return CgroupLayout(1, pids_dir, mem_dir if mem_ok else None)
    unified = _own_path("")
    if unified is not None and (ROOT / "cgroup.controllers").exists():
        own = ROOT / unified.lstrip("/")
        if _writable_dir(own):
            enabled = (own / "cgroup.subtree_control").read_text().split()
            return CgroupLayout(
                2,
                own if "pids" in enabled else None,
                own if "memory" in enabled else None,
            )
    return None


def remove_stale(layout: CgroupLayout) -> int:
    """Remove empty sandbox cgroups whose creating process is dead (it was killed before it
    could clean up). Names carry the creator's pid, so live owners are never touched."""
    removed = 0
    for parent in {layout.pids_parent, layout.memory_parent} - {None}:
        for d in parent.glob("traingym-*-*"):
            pid = int(d.name.split("-")[1])
            try:
                os.kill(pid, 0)
                continue  # its owner is alive
            except ProcessLookupError:
                pass
            if not (d / "cgroup.procs").read_text().strip():
                d.rmdir()
                removed += 1
    return removed


_cleaned: set[int] = set()  # pids of processes that already removed stale cgroups


class SandboxCgroup:
    """The cgroups of one sandbox. Create before starting it, `enter()` in the child, `remove()`."""

    def __init__(self, layout: CgroupLayout):
        if os.getpid() not in _cleaned:
            _cleaned.add(os.getpid())
            remove_stale(layout)
        name = f"traingym-{os.getpid()}-{uuid.uuid4().hex[:12]}"
        self.layout = layout
        self.pids = layout.pids_parent / name if layout.pids_parent else None
        self.memory = layout.memory_parent / name if layout.memory_parent else None
        for d in {self.pids, self.memory} - {None}:
            d.mkdir()

    def set_processes(self, n: int | None) -> None:
        if self.pids is not None:
            (self.pids / "pids.max").write_text("max" if n is None else str(n))

    def set_memory(self, n: int | None) -> None:
        if self.memory is None:
            return
        if self.layout.version == 2:
            (self.memory / "memory.max").write_text("max" if n is None else str(n))
            (self.memory / "memory.swap.max").write_text("0")
            return
        value = "-1" if n is None else str(n)
        limit = self.memory / "memory.limit_in_bytes"
        memsw = self.memory / "memory.memsw.limit_in_bytes"
        files = [limit, memsw] if memsw.exists() else [limit]
        raising = n is None or n > int(limit.read_text())
        for f in reversed(files) if raising else files:  # v1 keeps limit <= memsw at all times
            f.write_text(value)

    def oom_kills(self) -> int:
        """OOM kills so far in this cgroup (0 without a memory cgroup)."""
        if self.memory is None:
            return 0
        name = "memory.events" if self.layout.version == 2 else "memory.oom_control"
        for line in (self.memory / name).read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
        return 0

    def pids_limit_hits(self) -> int:
        """Forks refused so far because the pids limit was reached (0 without a pids cgroup)."""
        if self.pids is None:
            return 0
        for line in (self.pids / "pids.events").read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "max":
                return int(value)
        return 0

    def enter(self) -> None:
        """Move the calling process into the cgroups (runs in the child before exec)."""
        pid = str(os.getpid())
        for d in {self.pids, self.memory} - {None}:
            (d / "cgroup.procs").write_text(pid)

    def remove(self) -> None:
        """Remove the cgroups; every process in them must be dead already."""
        for d in {self.pids, self.memory} - {None}:
            if d.exists():
                d.rmdir()
