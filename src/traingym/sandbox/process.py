"""The `process` backend: rlimits and timeouts only. IT IS NOT A SECURITY BOUNDARY.

Code runs on the host as your user: it can read your files, use the network, kill your
processes and leave daemons behind. Use it for trusted code, machines without user namespaces,
or comparison with `bwrap`; it is never chosen implicitly (`open_sandbox("process")` only).
Covered: wall-clock kill of the process group, output cap, RLIMIT_CPU/AS/FSIZE/NPROC (NPROC
does not bind root), a private workspace removed on close; an image (sandbox/images.py) gives
its venv interpreter, with host files still readable.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile

from traingym.sandbox.base import Limits
from traingym.sandbox.client import AgentSandbox, agent_argv
from traingym.sandbox.images import Image, get_image


class ProcessSandbox(AgentSandbox):
    """A warm agent on the host with a temporary workspace. Use `await ProcessSandbox.create()`."""

    backend = "process"

    def __init__(self, limits: Limits | None = None, image=None):
        self.image = image if isinstance(image, Image) else get_image(image)
        self.workspace = tempfile.mkdtemp(prefix="traingym-process-")
        python = self.image.host_python  # its venv; the host's site-packages are NOT hidden
        argv = agent_argv(python, self.workspace, False, [self.workspace])
        super().__init__(argv, limits or Limits())
        self.env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": self.workspace}
        self.cwd = self.workspace

    @classmethod
    async def create(cls, limits: Limits | None = None, image=None) -> ProcessSandbox:
        if not isinstance(image, Image):
            image = await asyncio.to_thread(get_image, image)
        sandbox = cls(limits, image)
        try:
            return await sandbox.start()
        except BaseException:
            await sandbox.close()
            raise

    def rlimits_for(self, limits: Limits) -> dict:
        return {
            "cpu_s": limits.cpu_s,
            "file_bytes": limits.file_bytes,
            "address_space_bytes": limits.memory_bytes,
            "nproc": limits.processes,
        }

    async def close(self) -> None:
        await super().close()
        shutil.rmtree(self.workspace)
