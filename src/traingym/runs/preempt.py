"""SIGTERM as a clean preemption: the run stops at its next step boundary with a checkpoint.

While `traingym.train` runs in the main thread, `Preemption` turns SIGTERM into a request: the
loop finishes the current step, commits its checkpoint and raises `RunPreempted`; train closes
everything, releases the run lock and re-raises, and the CLI exits with `EXIT_CODE` (143) and a
`--resume` hint. A sync run so resumed ends bitwise equal to an uninterrupted one.
Limits: honoured at step boundaries only (not during the last step or its evaluation); a step
must fit in the scheduler's grace period; an ignored SIGTERM stays ignored. Child processes
keep the default SIGTERM, so a scheduler that signals the whole process group (scancel) fails
the run on a lost engine or rank instead of stopping it cleanly.
"""

from __future__ import annotations

import shlex
import signal
import threading
from pathlib import Path

EXIT_CODE = 128 + signal.SIGTERM  # 143


class RunPreempted(Exception):
    """The run stopped at a step boundary on a signal; checkpoint `step` is committed."""

    def __init__(self, signal_name: str, step: int, run_dir: Path):
        self.signal_name, self.step, self.run_dir = signal_name, step, Path(run_dir)
        super().__init__(f"stopped by {signal_name} after step {step} (checkpoint committed in "
                         f"{self.run_dir / 'checkpoints'}); resume with the same config and "
                         f"run_dir={str(self.run_dir)!r}, resume=True")


class Preemption:
    """While entered (main thread only), SIGTERM sets `requested` instead of ending the process."""

    def __init__(self):
        self.requested: str | None = None  # the signal's name once one came
        self._previous = None
        self._installed = False

    def _handle(self, signum, frame) -> None:  # only a flag: printing here could re-enter I/O
        self.requested = signal.Signals(signum).name

    def __enter__(self) -> Preemption:
        if threading.current_thread() is not threading.main_thread():
            return self
        previous = signal.getsignal(signal.SIGTERM)
        if previous is signal.SIG_IGN or previous is None:  # ignored, or set outside Python
            return self
        self._previous = signal.signal(signal.SIGTERM, self._handle)
        self._installed = True
        return self

    def __exit__(self, *exc) -> None:
        if self._installed:
            signal.signal(signal.SIGTERM, self._previous)
            self._installed = False


def resume_command(config: str | None, preset: str, overrides: list[str], run_dir: Path,
                   quiet: bool = False) -> str:
    """The `traingym train` command line that resumes a run started with these arguments."""
    args = ["traingym", "train"] + ([config] if config else [])
    if preset != "default":
        args += ["--preset", preset]
    for item in overrides:
        args += ["--set", item]
    args += ["--run-dir", str(run_dir), "--resume"] + (["--quiet"] if quiet else [])
    return shlex.join(args)
