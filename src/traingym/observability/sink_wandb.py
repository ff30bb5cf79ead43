"""Weights & Biases sink: one W&B run per traingym run, its files under RUN_DIR/wandb.

Mode: `sink_options.wandb.mode` ('offline' by default: no network and no login; upload later
with `wandb sync RUN_DIR/wandb/offline-run-*`; 'online' streams, and needs `wandb login`).
Other options go to wandb.init: project (default 'traingym'), name (default the run folder's
name), entity, group, tags, notes. The resolved config is the W&B run's config.

RL records use `step` as their x-axis and SFT records `sft/step` (W&B custom step metrics), so
the SFT phase's steps never collide with the RL steps. Not covered: resuming the same W&B run
on `--resume` (a resumed traingym run starts a new W&B run).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


class WandbSink:
    requires = ("wandb",)
    extra = "wandb"
    options = ("mode", "project", "name", "entity", "group", "tags", "notes")

    def open(self, run_dir: Path, config: dict[str, Any], options: dict[str, Any]) -> None:
        import wandb

        run_dir = Path(run_dir)
        opts = {"project": "traingym", "name": run_dir.name, "mode": "offline", **options}
        self.run = wandb.init(dir=str(run_dir), config=config,
                              reinit="create_new", **opts,
                              settings=wandb.Settings(silent=True, console="off"))
        self.run.define_metric("step")
        self.run.define_metric("sft/step")
        self.run.define_metric("sft/*", step_metric="sft/step")
        self.run.define_metric("*", step_metric="step")

    def log(self, step: int, record: dict[str, float]) -> None:
        sft = any(k.startswith("sft/") for k in record)
        self.run.log({**record, ("sft/step" if sft else "step"): step})

    def close(self) -> None:
        self.run.finish()
