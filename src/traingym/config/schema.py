"""One typed config per run: `Config` over the sections, each of which lives beside the
component that reads it and validates itself; the rules across sections are in rules.py,
loading (files, `--set`, presets) in load.py."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import ConfigDict, Field, model_validator

from traingym.algorithms.config import AlgorithmConfig
from traingym.cluster.config import AsyncConfig, ClusterConfig
from traingym.config import rules
from traingym.core.errors import Strict
from traingym.envs.config import EvalConfig, TaskConfig
from traingym.models.config import ModelConfig
from traingym.observability.config import ObservabilityConfig
from traingym.rollout.config import RolloutConfig
from traingym.runs.config import CheckpointConfig
from traingym.trainer.config import DistillConfig, LoraConfig, SftConfig, TrainerConfig
from traingym.weights.config import WeightsConfig


class Config(Strict):
    model_config = ConfigDict(extra="forbid", validate_assignment=True, validate_by_name=True,
                              validate_by_alias=True, serialize_by_alias=True)

    seed: int = 0
    steps: int = Field(40, ge=1, description="optimizer steps")
    threads: int = Field(0, ge=0, description="torch threads (0: all cores)")
    huge_pages: bool = Field(True, description="torch's CPU tensors of 2 MiB and more on "
                             "transparent huge pages, where the kernel offers them (fewer page "
                             "faults; core/memory.py); false: torch's default 4 KiB pages")
    model: ModelConfig = ModelConfig()
    task: TaskConfig = TaskConfig()
    rollout: RolloutConfig = RolloutConfig()
    trainer: TrainerConfig = TrainerConfig()
    algorithm: AlgorithmConfig = AlgorithmConfig()
    eval: EvalConfig = EvalConfig()
    checkpoint: CheckpointConfig = CheckpointConfig()
    weights: WeightsConfig = WeightsConfig()
    mode: Literal["sync", "async"] = Field("sync", description="sync: generate, then train, "
                                           "in one process; async: engines in other processes "
                                           "keep generating while the trainer trains")
    async_: AsyncConfig = Field(AsyncConfig(), alias="async")
    cluster: ClusterConfig = ClusterConfig()
    lora: LoraConfig = LoraConfig()
    sft: SftConfig = SftConfig()
    distill: DistillConfig = DistillConfig()
    observability: ObservabilityConfig = ObservabilityConfig()

    @model_validator(mode="after")
    def _across_sections(self) -> Config:
        rules.check(self)  # config/rules.py: ValueErrors name the problem and the fix
        return self


PRESETS: dict[str, dict[str, Any]] = {
    "default": {},
    "tiny": {
        "steps": 4,
        "model": {"path": "tiny", "engine_dtype": "float32"},
        "task": {"reward": "traingym.envs.tasks:digit_fraction"},
        "rollout": {"prompts_per_step": 4, "group_size": 4, "max_new_tokens": 4},
        "trainer": {"lr": 1e-3, "bf16_autocast": False},
        "eval": {"num_prompts": 16, "samples_per_prompt": 2},
    },
}


