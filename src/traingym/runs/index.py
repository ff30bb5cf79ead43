"""Runs and checkpoints as objects: `traingym.open_run(run_dir)` and `traingym runs [DIR]`.

A `RunView` reads a run directory without writing to it or taking its lock: config, step
records, committed checkpoints (runs/checkpoint.py), results.json, evals, and a status:
"running" (run.lock held or its record names a live local process, runs/lock.py), "finished"
(results.json exists), "preempted" (a checkpoint of its last recorded step, runs/preempt.py),
else "failed".
Limits: a run killed right after committing its last step's checkpoint looks "preempted";
a run on another host without cross-host flock is "running" only if its record names a live
local process.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from traingym.runs import lock as runlock

MARKER = "COMMITTED"  # runs/checkpoint.py's marker (not imported: it imports torch)


@dataclass(frozen=True)
class Checkpoint:
    path: Path
    step: int

    @property
    def state(self) -> dict:
        return json.loads((self.path / "state.json").read_text())

    def verify(self) -> dict:
        """Check every file against the manifest (runs/checkpoint.py); return the manifest."""
        from traingym.runs import checkpoint  # heavy: safetensors, torch

        return checkpoint.verify(self.path)


def is_run_dir(path: Path) -> bool:
    """A traingym run directory: its config.json is a traingym config (has 'model' and
    'rollout' sections), not a Hugging Face model config."""
    cfg = Path(path) / "config.json"
    if not cfg.is_file():
        return False
    try:
        data = json.loads(cfg.read_text())
    except (json.JSONDecodeError, OSError, UnicodeDecodeError):
        return False
    return isinstance(data, dict) and "rollout" in data and isinstance(data.get("model"), dict)


def committed(root: Path) -> list[Path]:
    """Committed checkpoint folders, oldest first (as checkpoint.committed)."""
    if not root.is_dir():
        return []
    return sorted(p for p in root.glob("step_*") if (p / MARKER).is_file())


class RunView:
    def __init__(self, run_dir: str | Path, read_config=None):
        self.path, self._read_config = Path(run_dir), read_config
        if not is_run_dir(self.path):
            raise FileNotFoundError(f"{self.path} is not a run directory (no traingym "
                                    "config.json); give a folder `traingym train` wrote")

    def __repr__(self) -> str:
        return f"RunView({str(self.path)!r}, status={self.status!r})"

    @cached_property
    def config_dict(self) -> dict:
        return json.loads((self.path / "config.json").read_text())

    @cached_property
    def config(self):
        """The run's Config, validated as this version of traingym reads it (needs the
        `read_config` that `traingym.open_run` passes; runs/ sits below the config layer)."""
        if self._read_config is None:
            raise TypeError("this RunView was made without a config reader: use "
                            "traingym.open_run(run_dir), or read `config_dict`")
        return self._read_config(self.path)

    @property
    def events(self) -> list[dict]:
        path = self.path / "events.jsonl"
        if not path.exists():
            return []
        return [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()]

    @property
    def checkpoints(self) -> list[Checkpoint]:
        return [Checkpoint(p, int(p.name.removeprefix("step_")))
                for p in committed(self.path / "checkpoints")]

    @property
    def latest_checkpoint(self) -> Checkpoint | None:
        saved = self.checkpoints
        return saved[-1] if saved else None

    @property
    def results(self) -> dict | None:
        return _json(self.path / "results.json")

    @property
    def eval_before(self) -> dict | None:
        return _json(self.path / "eval_before.json")

    @property
    def eval_after(self) -> dict | None:
        return _json(self.path / "eval_after.json")

    @property
    def steps_total(self) -> int:
        return int(self.config_dict.get("steps", 0))

    @property
    def steps_done(self) -> int:
        events = self.events
        return int(events[-1]["step"]) if events else 0

    @property
    def status(self) -> str:
        if lock_held(self.path):
            return "running"
        if (self.path / "results.json").exists():
            return "finished"
        latest = self.latest_checkpoint
        if latest is not None and latest.step == self.steps_done < self.steps_total:
            return "preempted"
        return "failed"

    def held_out_change(self) -> dict | None:
        """The target metric's paired change {'metric', 'delta', 'se', 'z'} from results.json."""
        report = (self.results or {}).get("eval", {})
        metric = report.get("target_metric")
        d = report.get("delta", {}).get(metric)
        return {"metric": metric, **d} if d else None


def _json(path: Path) -> dict | None:
    return json.loads(path.read_text()) if path.exists() else None


def lock_held(run_dir: Path) -> bool:
    """Is the run directory's lock held now (by any process, this one included)? Read from
    /proc/locks, so looking never takes the lock (a probe with flock could make a run that
    starts at that instant see its directory in use); where /proc/locks is unreadable, a
    non-blocking shared flock probe instead."""
    path = Path(run_dir) / runlock.LOCK_NAME
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    held = _flock_in_proc_locks(st)
    if held is None:
        held = _flock_probe(path)
    if held:
        return True
    fd = os.open(path, os.O_RDONLY)
    try:
        rec = runlock._read(fd)
    finally:
        os.close(fd)
    if not rec or "pid" not in rec or rec.get("host") != socket.gethostname():
        return False
    return runlock._alive(int(rec["pid"]), rec.get("pid_start"))


def _flock_in_proc_locks(st: os.stat_result) -> bool | None:
    key = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    try:
        lines = Path("/proc/locks").read_text().splitlines()
    except OSError:
        return None
    return any(" FLOCK " in f" {ln} " and key in ln.split() for ln in lines)


def _flock_probe(path: Path) -> bool:
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)


def open_run(run_dir: str | Path, read_config=None) -> RunView:
    return RunView(run_dir, read_config)


def find_runs(root: str | Path, read_config=None) -> list[RunView]:
    """`root` itself if it is a run, else the runs one or two levels below it, sorted by path."""
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"{root} is not a folder; give the folder that holds your runs "
                                "(default: runs)")
    if is_run_dir(root):
        return [RunView(root, read_config)]
    found = sorted({p.parent for pattern in ("*/config.json", "*/*/config.json")
                    for p in root.glob(pattern) if is_run_dir(p.parent)})
    return [RunView(p, read_config) for p in found]


def table(runs: list[RunView]) -> str:
    """One line per run: path, status, steps done/total, last reward, held-out change."""
    rows = [("run", "status", "steps", "last reward", "held-out change")]
    for r in runs:
        events = r.events
        last = f"{events[-1]['reward_mean']:.3f}" if events and "reward_mean" in events[-1] else "-"
        change = r.held_out_change()
        held = (f"{change['metric']} {change['delta']:+.3f} ± {change['se']:.3f}"
                if change else "-")
        rows.append((str(r.path), r.status, f"{r.steps_done}/{r.steps_total}", last, held))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows)
