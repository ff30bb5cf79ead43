"""Live progress on the terminal (rich), or one plain line per step when not a TTY."""

from __future__ import annotations

import sys
import time


class Progress:
    def __init__(self, total_steps: int, start_step: int = 0, enabled: bool = True):
        self.total, self.start = total_steps, start_step
        self.enabled = enabled
        self.t0 = time.monotonic()
        self.live = None
        if enabled and sys.stdout.isatty():
            from rich.live import Live

            self.live = Live("", refresh_per_second=4, transient=False)
            self.live.start()

    def message(self, text: str) -> None:
        if not self.enabled:
            return
        if self.live is not None:
            self.live.console.print(text)
        else:
            print(text, flush=True)

    def update(self, step: int, metrics: dict) -> None:
        if not self.enabled:
            return
        done = step + 1 - self.start
        elapsed = time.monotonic() - self.t0
        eta = elapsed / done * (self.total - step - 1) if done else 0.0
        line = (f"step {step + 1}/{self.total}  reward {metrics['reward_mean']:.3f}  "
                f"loss {metrics['loss']:+.4f}  kept {metrics['groups_kept']}/{metrics['groups']}  "
                f"gen {metrics['gen_tokens_per_s']:.0f} tok/s  {metrics['seconds_step']:.1f} s/step  "
                f"ETA {eta:.0f} s")
        if self.live is not None:
            self.live.update(line)
        else:
            print(line, flush=True)

    def close(self) -> None:
        if self.live is not None:
            self.live.stop()
