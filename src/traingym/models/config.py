"""The `model` config section: which model, its engine copy's dtype, a preset."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from traingym.core.errors import Strict
from traingym.models.presets import check_path


class ModelConfig(Strict):
    path: str = Field("embedded", description="'embedded' (SmolLM2-135M-Instruct), 'tiny' (a "
                      "0.1M-param Llama with a tokenizer trained on the fly), or a local HF folder")
    engine_dtype: Literal["auto", "bfloat16", "float32"] = Field(
        "auto", description="dtype of the rollout engine's copy of the weights; 'auto': "
        "bfloat16 where the device has fast bf16 kernels, else float32 (precision.py)")
    preset: str | None = Field(None, description="a model preset (models/presets.py, e.g. "
                               "'qwen3-0.6b'): its rollout.engine, trainer.lr and "
                               "trainer.micro_batch_groups go under the values you set; "
                               "model.path must hold that model (its config.json is checked)")

    @model_validator(mode="after")
    def _preset_matches_path(self) -> ModelConfig:
        if self.preset is not None:
            check_path(self.preset, self.path)  # ConfigError / ValueError name the mismatch
        return self
