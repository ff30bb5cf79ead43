"""A toy sandbox backend: the `process` backend (sandbox/process.py: rlimits and timeouts only,
NOT a security boundary; a test-only toy, never for untrusted code) that appends one line per
execution, "<pid> <exit code> <stdin bytes>", to the file named by $TOY_SANDBOX_LOG. Proof that
a backend is one file plus one registry line (sandbox/__init__.py BACKENDS) or a "module:Class"
path given to an env (CodeEnvMaker(backend=...)).
"""

from __future__ import annotations

import os

from traingym.sandbox.process import ProcessSandbox


class ToySandbox(ProcessSandbox):
    backend = "toy"

    async def exec(self, command, *, stdin=b"", files=None, limits=None):
        result = await super().exec(command, stdin=stdin, files=files, limits=limits)
        if os.environ.get("TOY_SANDBOX_LOG"):
            _log(os.environ["TOY_SANDBOX_LOG"], f"{os.getpid()} {result.exit_code} {len(stdin)}")
        return result


def _log(path: str, line: str) -> None:
    with open(path, "a") as f:  # one short line: not worth a thread
        f.write(line + "\n")
