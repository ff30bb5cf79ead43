"""The `rollout` config section: the engine, its options, sampling and episode limits."""

from __future__ import annotations

from typing import Any

from pydantic import Field, model_validator

from traingym.core.errors import Strict


class RolloutConfig(Strict):
    engine: str = Field("torch", description="the rollout engine (rollout/registry.py): "
                        "'torch' (built-in), 'vllm', 'sglang', 'openai' (read-only), or a "
                        "'module:Class' path")
    engine_options: dict[str, Any] = Field(
        default_factory=dict, description="the engine's own settings, checked against its "
        "Options model (e.g. vllm: python, gpu_memory_utilization)")
    prompts_per_step: int = Field(16, ge=1, description="prompts (groups) per optimizer step")
    group_size: int = Field(4, ge=2, description="completions sampled per prompt (G)")
    temperature: float = Field(1.0, gt=0, description="training sampling temperature")
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = Field(0, ge=0, description="0 disables top-k")
    max_new_tokens: int = Field(8, ge=1)
    max_batch_rows: int = Field(64, ge=1, description="rows the engine decodes at once")
    ignore_eos: bool = Field(False, description="keep sampling past the end-of-turn token, so "
                             "every completion has exactly max_new_tokens (for benchmarks)")
    max_turns: int = Field(8, ge=1, description="policy turns per multi-turn episode; the "
                           "episode ends there (single-turn envs end after one anyway)")
    max_context_tokens: int = Field(2048, ge=2, description="prompt + all turns + environment "
                                    "tokens; an episode ends before its context would pass it")

    @model_validator(mode="after")
    def _known_engine(self) -> RolloutConfig:
        from traingym.rollout import registry  # heavy: safetensors, torch

        registry.options(self.engine, self.engine_options)  # ValueErrors name the problem
        return self
