"""Live progress: a rich progress bar on a terminal, one plain line per step otherwise.

Each step shows the step, mean reward, loss, kept groups, generated tokens/s, staleness
(async runs: the mean and max policy-version lag of the step's samples) and the ETA (from
the mean time per step since this process started). Messages (held-out scores, the
utilisation line) print above the bar.
"""

from __future__ import annotations

import sys
import time


def step_text(metrics: dict) -> str:
    """The figures of one step record, for the bar and the plain line."""
    parts = [f"reward {metrics['reward_mean']:.3f}", f"loss {metrics['loss']:+.4f}",
             f"kept {metrics['groups_kept']}/{metrics['groups']}",
             f"gen {metrics['gen_tokens_per_s']:.0f} tok/s",
             f"{metrics['seconds_step']:.1f} s/step"]
    if "async_staleness_mean" in metrics:
        parts.append(f"stale {metrics['async_staleness_mean']:.1f}"
                     f"/{metrics['async_staleness_max']}")
    return "  ".join(parts)


class Progress:
    def __init__(self, total_steps: int, start_step: int = 0, enabled: bool = True):
        self.total, self.start = total_steps, start_step
        self.enabled = enabled
        self.t0 = time.monotonic()
        self.bar = None
        if enabled and sys.stdout.isatty():
            from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeRemainingColumn
            from rich.progress import Progress as Bar

            self.bar = Bar(TextColumn("step"), MofNCompleteColumn(), BarColumn(bar_width=20),
                           TextColumn("ETA"), TimeRemainingColumn(),
                           TextColumn("{task.fields[figures]}"))
            self.task = self.bar.add_task("train", total=total_steps, completed=start_step,
                                          figures="")
            self.bar.start()

    def message(self, text: str) -> None:
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.console.print(text)
        else:
            print(text, flush=True)

    def eta_s(self, step: int) -> float:
        done = step + 1 - self.start
        elapsed = time.monotonic() - self.t0
        return elapsed / done * (self.total - step - 1) if done > 0 else 0.0

    def update(self, step: int, metrics: dict) -> None:
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.update(self.task, completed=step + 1, figures=step_text(metrics))
        else:
            print(f"step {step + 1}/{self.total}  {step_text(metrics)}  "
                  f"ETA {self.eta_s(step):.0f} s", flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()
            self.bar = None
