"""TensorBoard sink: scalar event files under RUN_DIR/tensorboard (`tensorboard --logdir RUN_DIR`).

Writes through torch.utils.tensorboard's SummaryWriter (it needs the `tensorboard` package,
extra `tensorboard`). Each step's numbers are flushed at once, so a live TensorBoard sees them.
On resume the redone steps are written again; TensorBoard shows the later value.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


class TensorBoardSink:
    requires = ("tensorboard",)
    extra = "tensorboard"
    options = ("subdir",)  # folder under the run directory (default "tensorboard")

    def open(self, run_dir: Path, config: dict[str, Any], options: dict[str, Any]) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.dir = Path(run_dir) / options.get("subdir", "tensorboard")
        self.writer = SummaryWriter(log_dir=str(self.dir))

    def log(self, step: int, record: dict[str, float]) -> None:
        for key, value in record.items():
            self.writer.add_scalar(key, value, global_step=step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()
