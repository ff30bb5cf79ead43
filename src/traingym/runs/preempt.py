"""SIGTERM as a clean preemption: the run stops at its next step boundary with a checkpoint.

Schedulers (Slurm, Kubernetes, Ray, `timeout`) preempt a job with SIGTERM, then SIGKILL after
a grace period. While `traingym.train` runs, `Preemption` turns SIGTERM into a request: the
loop (sync and async) finishes the current step (optimizer step, weight publish, the step's
record), commits a checkpoint of it (unless that step's checkpoint was just written), and
raises `RunPreempted`. `traingym.train` then closes engines, sandboxes and trainer ranks as a
normal end does, releases the run directory's lock, and re-raises; the CLI prints one line,

    traingym: stopped by SIGTERM after step N; resume with: traingym train ... --resume

and exits with `EXIT_CODE` (143 = 128 + SIGTERM, what a shell reports for a job SIGTERM
killed). `--resume` continues from that checkpoint; a sync run so resumed ends bitwise equal
to an uninterrupted one. Further SIGTERMs while stopping change nothing; a SIGINT
(KeyboardInterrupt) or SIGKILL while the checkpoint is written leaves an uncommitted folder
that is never loaded (checkpoint.py writes COMMITTED last), so resume uses the previous one.

Limits: the request is honoured at step boundaries only: SIGTERM while the run is built or
evaluated before training stops it after the first step; during the last step or the evaluation after it, it is not
honoured (the run finishes). A step must fit in the scheduler's grace period. The handler is
installed only when `train` runs in the main thread (Python delivers signals there) and
the previous handler is restored when it returns; a SIGTERM that the caller set to be ignored
stays ignored. Child processes (async engines, trainer ranks, sandboxes) keep the default
SIGTERM: a scheduler that signals the whole process group (Slurm's scancel does) ends them at
once, and the run then fails on the lost engine or rank rather than stopping cleanly, unless
the scheduler signals only the main process (Kubernetes signals PID 1; `scancel --batch`).
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
