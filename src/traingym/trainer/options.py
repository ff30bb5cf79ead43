"""Config sections of the training extras: `lora`, `sft` and `distill` (config.py holds them
in `Config`; `trainer.gradient_checkpointing` and `trainer.micro_batch_tokens` live in
`TrainerConfig`). Each section is off by default: `lora.rank = 0`, `sft.data = None`,
`distill.teacher = None`.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class LoraConfig(_Strict):
    """LoRA adapters through `peft` (trainer/lora.py): the trainer trains only the adapters."""

    rank: int = Field(0, ge=0, description="adapter rank r; 0: LoRA off (full fine-tuning)")
    alpha: float = Field(16.0, gt=0, description="scale alpha; the update is (alpha / r) B A")
    dropout: float = Field(0.0, ge=0, lt=1, description="dropout on the adapter's input")
    target_modules: list[str] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"],
        description="names of the linear layers that get adapters (peft target_modules)")
    sync: Literal["merged", "adapter"] = Field(
        "merged", description="what reaches the engine: 'merged' (base + BA, every tensor the "
        "engine serves) or 'adapter' (only the A and B tensors; the engine merges them into "
        "the base it keeps; mode='sync' and the built-in torch engine only)")


class SftConfig(_Strict):
    """Supervised warm start on chat data before the RL steps (trainer/sft.py)."""

    data: str | None = Field(None, description="a JSONL file of {'messages': [...]} rows or a "
                             "local `datasets` folder; None: no SFT phase")
    epochs: float = Field(1.0, gt=0, description="passes over the data (used when steps = 0)")
    steps: int = Field(0, ge=0, description="optimizer steps of the SFT phase; 0: from epochs")
    batch_size: int = Field(8, ge=1, description="conversations per SFT step")
    lr: float = Field(1e-4, gt=0, description="learning rate of the SFT phase")
    checkpoint_every: int = Field(0, ge=0, description="checkpoint every N SFT steps (0: only "
                                  "at the end of the phase)")


class DistillConfig(_Strict):
    """On-policy distillation (algorithms/distill.py): a teacher scores the student's samples."""

    teacher: str | None = Field(None, description="the teacher: 'tiny', 'embedded' or a local "
                                "HF folder, or a run's checkpoint folder (step_NNNNNN, its "
                                "model.safetensors loaded over model.path); None: off")
    coef: float = Field(1.0, ge=0, description="weight of the per-token reverse-KL advantage "
                        "(teacher logp - student logp)")
    reward_coef: float = Field(0.0, ge=0, description="weight of the task's group advantage "
                               "mixed in; 0: distillation alone")

    @model_validator(mode="after")
    def _some_signal(self) -> DistillConfig:
        if self.teacher is not None and self.coef == 0 and self.reward_coef == 0:
            raise ValueError("distill.coef and distill.reward_coef are both 0: nothing to "
                             "learn from; set distill.coef > 0")
        return self


def check_extras(cfg) -> None:
    """Checks across sections for the extras; each ValueError names the problem and the fix."""
    lora, t = cfg.lora, cfg.trainer
    if lora.rank == 0 and ({"alpha", "dropout", "target_modules", "sync"}
                           & lora.model_fields_set):
        raise ValueError("lora.alpha, dropout, target_modules and sync apply only with "
                         "lora.rank > 0; set lora.rank (e.g. 8)")
    if lora.rank > 0 and t.data_parallel > 1:
        raise ValueError("lora.rank > 0 runs in one trainer process: set "
                         "trainer.data_parallel = 1 (LoRA with data-parallel ranks is not "
                         "covered)")
    if lora.sync == "adapter" and (cfg.mode != "sync" or cfg.rollout.engine != "torch"):
        raise ValueError("lora.sync='adapter' needs mode='sync' and rollout.engine='torch' "
                         "(the engine that merges adapters); use lora.sync='merged' otherwise")
    if cfg.sft.data is None and cfg.sft.model_fields_set - {"data"}:
        raise ValueError("the 'sft' section's settings apply only with sft.data (a JSONL of "
                         "{'messages': [...]} rows or a datasets folder)")
    if cfg.sft.data is not None and cfg.mode != "sync":
        raise ValueError("an sft phase runs only with mode='sync'")
    if cfg.distill.teacher is None and cfg.distill.model_fields_set - {"teacher"}:
        raise ValueError("distill.coef and reward_coef apply only with distill.teacher")
    if cfg.distill.teacher is not None and (t.data_parallel > 1 or cfg.mode != "sync"):
        raise ValueError("distill.teacher runs with mode='sync' and trainer.data_parallel = 1 "
                         "(distillation with engine processes or ranks is not covered)")
    if cfg.distill.teacher is not None and lora.rank > 0:
        raise ValueError("distill.teacher with lora.rank > 0 is not covered: distil into the "
                         "full model (lora.rank = 0)")
    if t.gradient_checkpointing and t.data_parallel > 1:
        raise ValueError("trainer.gradient_checkpointing runs in one trainer process: set "
                         "trainer.data_parallel = 1")
