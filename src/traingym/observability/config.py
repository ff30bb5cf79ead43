"""The `observability` config section: sinks, trace, samples kept."""

from __future__ import annotations

from typing import Any

from pydantic import Field, model_validator

from traingym.core.errors import Strict
from traingym.observability.sinks import check


class ObservabilityConfig(Strict):
    sinks: list[str] = Field(default_factory=list, description="metric sinks beside "
                             "events.jsonl (observability/sinks.py): 'tensorboard', 'wandb', "
                             "'mlflow'; each is an extra, and one that fails is reported once "
                             "and dropped, never stopping the run")
    sink_options: dict[str, dict[str, Any]] = Field(
        default_factory=dict, description="per-sink options by sink name, e.g. "
        "{wandb = {project = 'x', mode = 'offline'}}")
    trace: bool = Field(True, description="write trace.json (Chrome/Perfetto trace events: "
                        "a span for every phase on every process)")
    samples_per_step: int = Field(4, ge=0, description="groups per step whose samples are "
                                  "written to samples.jsonl (for the dashboard)")

    @model_validator(mode="after")
    def _sinks_known(self) -> ObservabilityConfig:
        check(self.sinks, self.sink_options)  # names, options, installed extras
        return self
