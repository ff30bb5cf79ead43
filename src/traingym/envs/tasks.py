"""Built-in verifiable tasks. Each is a list of rows {'prompt', 'answer'} and a reward that
checks correctness: 1.0 when the first integer in the completion equals the answer, else 0.0.

The prompts are meant to be pre-filled with "The answer is" (config `task.prefill`), which the
embedded SmolLM2-135M-Instruct follows; it ignores answer tags, so a tag-format reward would give
RL no signal. Train and held-out rows are disjoint problems, split by a fixed seed.

- arith: single-digit a + b, a - b and a * b (300 problems).
- add2: a + b for a, b in 0..19 (400 problems), harder for the embedded model.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

from traingym.core.types import Sample

_INT = re.compile(r"-?\d+")


def first_integer(text: str) -> int | None:
    m = _INT.search(text)
    return int(m.group()) if m else None


def exact_answer(sample: Sample) -> float:
    """1.0 if the first integer of the completion equals the row's 'answer'."""
    return 1.0 if first_integer(sample.completion_text) == int(sample.example["answer"]) else 0.0


def _arith_rows() -> list[dict]:
    rows = []
    for a in range(10):
        for b in range(10):
            rows.append({"prompt": f"What is {a} + {b}?", "answer": a + b})
            rows.append({"prompt": f"What is {a} - {b}?", "answer": a - b})
            rows.append({"prompt": f"What is {a} * {b}?", "answer": a * b})
    return rows


def _add2_rows() -> list[dict]:
    return [{"prompt": f"What is {a} + {b}?", "answer": a + b} for a in range(20) for b in range(20)]


@dataclass(frozen=True)
class BuiltinTask:
    name: str
    train: list[dict]
    heldout: list[dict]


TASKS = {"arith": _arith_rows, "add2": _add2_rows}  # task.name -> row maker


def builtin_task(name: str, num_heldout: int = 128, seed: int = 1234) -> BuiltinTask:
    from traingym.core.errors import ConfigError  # heavy: pydantic

    if name not in TASKS:
        raise ConfigError(f"unknown built-in task {name!r}; choose one of {sorted(TASKS)}, or "
                          "give task.dataset and task.reward")
    rows = TASKS[name]()
    random.Random(seed).shuffle(rows)
    if num_heldout >= len(rows):
        raise ConfigError(f"task {name!r} has {len(rows)} problems; eval.num_prompts="
                          f"{num_heldout} leaves none to train on (set eval.num_prompts below "
                          f"{len(rows)})")
    return BuiltinTask(name, train=rows[num_heldout:], heldout=rows[:num_heldout])


def digit_fraction(sample: Sample) -> float:
    """Fraction of the completion's characters that are digits: a shaping reward with signal
    even for a randomly initialised model, used by the `tiny` smoke-test preset. It measures
    format, not correctness."""
    text = sample.completion_text
    return sum(c.isdigit() for c in text) / len(text) if text else 0.0
