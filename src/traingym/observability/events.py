"""The run directory's logs: events.jsonl (one object per step, the source of truth) and
samples.jsonl (a few prompt/completion/reward records per step)."""

from __future__ import annotations

import json
from pathlib import Path

from traingym.types import Group


class RunLog:
    def __init__(self, run_dir: Path, samples_per_step: int = 4):
        self.events_path = run_dir / "events.jsonl"
        self.samples_path = run_dir / "samples.jsonl"
        self.samples_per_step = samples_per_step

    def truncate_after(self, step: int) -> None:
        """On resume, drop records of steps after the checkpoint (they will be redone)."""
        for path in (self.events_path, self.samples_path):
            if path.exists():
                keep = [ln for ln in path.read_text().splitlines()
                        if ln.strip() and json.loads(ln).get("step", -1) <= step]
                path.write_text("".join(ln + "\n" for ln in keep))

    def event(self, record: dict) -> None:
        with open(self.events_path, "a") as f:
            f.write(json.dumps(record) + "\n")

    def samples(self, step: int, groups: list[Group]) -> None:
        with open(self.samples_path, "a") as f:
            for group in groups[: self.samples_per_step]:
                s = group.samples[0]
                f.write(json.dumps({"step": step, "prompt": s.prompt_text,
                                    "completion": s.completion_text, "reward": s.reward,
                                    "example": s.example}) + "\n")


def read_events(run_dir: Path) -> list[dict]:
    path = Path(run_dir) / "events.jsonl"
    return [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()]
