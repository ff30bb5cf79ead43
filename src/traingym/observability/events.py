"""The run directory's logs: events.jsonl (one record per step, the source of truth) and
samples.jsonl (every sample of `samples_per_step` groups per step, for the dashboard), in the
schema of observability/schema.py. Each step record goes to events.jsonl first, then to the
sinks (observability/sinks.py), which never stop the run. A sample has a stable `sid`
('<step>-<group>-<member>'); multi-turn completions are split into turns by the loss mask and
Hermes-format tool calls parsed; StepResult.info comes as `env_info`.
Not covered: tool calls in another parser's format (they stay in the turn text).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from traingym.core.toolcalls import HermesParser, ToolCall
from traingym.core.types import Group, Sample
from traingym.observability.schema import SCHEMA_VERSION


class RunLog:
    def __init__(self, run_dir: Path, samples_per_step: int = 4, sinks=None, tokenizer=None):
        self.events_path = run_dir / "events.jsonl"
        self.samples_path = run_dir / "samples.jsonl"
        self.samples_per_step = samples_per_step
        self.sinks = sinks  # observability.sinks.Sinks, or None
        self.tokenizer = tokenizer  # decodes multi-turn episodes turn by turn

    def truncate_after(self, step: int) -> None:
        """On resume, drop records of steps after the checkpoint (they will be redone)."""
        for path in (self.events_path, self.samples_path):
            if path.exists():
                keep = [ln for ln in path.read_text().splitlines()
                        if ln.strip() and json.loads(ln).get("step", -1) <= step]
                path.write_text("".join(ln + "\n" for ln in keep))

    def event(self, record: dict) -> None:
        record = {"schema": SCHEMA_VERSION, **record}
        with open(self.events_path, "a") as f:
            f.write(json.dumps(record) + "\n")
        if self.sinks is not None:
            self.sinks.log(record)

    def samples(self, step: int, groups: list[Group]) -> None:
        """Samples of step index `step` (0-based), recorded under `step + 1` like its event."""
        if self.samples_per_step <= 0:
            return
        with open(self.samples_path, "a") as f:
            for group in groups[: self.samples_per_step]:
                for member, s in enumerate(group.samples):
                    f.write(json.dumps(self.sample_record(step + 1, group.index, member, s))
                            + "\n")

    def sample_record(self, step: int, group: int, member: int, s: Sample) -> dict[str, Any]:
        out = {"schema": SCHEMA_VERSION, "sid": f"{step}-{group}-{member}", "step": step,
               "group": group, "member": member, "reward": s.reward, "prompt": s.prompt_text,
               "completion": s.completion_text, "finish_reason": s.finish_reason,
               "turns": s.turns, "tokens": sum(s.loss_mask), "example": s.example}
        turns = self.split_turns(s)
        if len(turns) > 1:
            out["messages"] = turns
        calls = tool_calls(turns or [{"role": "policy", "text": s.completion_text}])
        if calls:
            out["tool_calls"] = calls
        if s.env_info:
            out["env_info"] = s.env_info
        if s.drop_reason:
            out["dropped"] = s.drop_reason
        return out

    def split_turns(self, s: Sample) -> list[dict[str, str]]:
        """The completion as [{'role': 'policy'|'env', 'text'}], one entry per run of the
        loss mask; [] without a tokenizer."""
        if self.tokenizer is None or not s.completion_ids:
            return []
        turns, start = [], 0
        mask = s.loss_mask
        for i in range(1, len(mask) + 1):
            if i == len(mask) or mask[i] != mask[start]:
                text = self.tokenizer.decode(s.completion_ids[start:i], skip_special_tokens=True)
                turns.append({"role": "policy" if mask[start] else "env", "text": text})
                start = i
        return turns

    def close(self) -> None:
        if self.sinks is not None:
            self.sinks.close()


def tool_calls(turns: list[dict[str, str]]) -> list[dict[str, Any]]:
    """Hermes-format tool calls in the policy turns, numbered by policy turn (1-based)."""
    if not any("<tool_call>" in t["text"] for t in turns):
        return []
    out, n = [], 0
    for t in turns:
        if t["role"] != "policy":
            continue
        n += 1
        for call in HermesParser().parse(t["text"]):
            out.append({"turn": n, "name": call.name, "arguments": call.arguments}
                       if isinstance(call, ToolCall) else {"turn": n, "error": call.message})
    return out


def _read_jsonl(path: Path) -> list[dict]:
    """The records of a JSONL file; a last line without its newline is a record still being
    written by a live run, and is left out."""
    text = path.read_text()
    lines = text.split("\n")
    return [json.loads(ln) for ln in lines[:-1] if ln.strip()]  # lines[-1]: after the last \n


def read_events(run_dir: Path) -> list[dict]:
    return _read_jsonl(Path(run_dir) / "events.jsonl")


def read_samples(run_dir: Path) -> list[dict]:
    path = Path(run_dir) / "samples.jsonl"
    return _read_jsonl(path) if path.exists() else []
