"""Config sections of the training extras: `lora`, `sft` and `distill` (config.py holds them
in `Config`; `trainer.gradient_checkpointing` and `trainer.micro_batch_tokens` live in
`TrainerConfig`). Each section is off by default: `lora.rank = 0`, `sft.data = None`,
`distill.teacher = None`.
"""

from __future__ import annotations

from typing import Any, Literal

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
                                "model.safetensors loaded over model.path); with "
                                "teacher_engine='openai' (an engine that takes no weights), "
                                "the server's URL; None: off")
    teacher_engine: str | None = Field(None, description="serve the teacher through the engine "
                                       "seam (rollout/registry.py): 'torch', 'vllm', 'openai' "
                                       "or 'module:Class', an engine that scores given tokens "
                                       "(abilities.scores_tokens); None: a second local model "
                                       "in the trainer process")
    teacher_engine_options: dict[str, Any] = Field(
        default_factory=dict, description="the teacher engine's options (as "
        "rollout.engine_options), e.g. vllm: {max_model_len = 2048}; openai: {model = ...}, its "
        "base_url is distill.teacher")
    coef: float = Field(1.0, ge=0, description="weight of the per-token reverse-KL advantage "
                        "(teacher logp - student logp)")
    reward_coef: float = Field(0.0, ge=0, description="weight of the task's group advantage "
                               "mixed in; 0: distillation alone")

    @model_validator(mode="after")
    def _some_signal(self) -> DistillConfig:
        if self.teacher is not None and self.coef == 0 and self.reward_coef == 0:
            raise ValueError("distill.coef and distill.reward_coef are both 0: nothing to "
                             "learn from; set distill.coef > 0")
        if self.teacher_engine is not None and self.teacher is not None:
            teacher_options(self.teacher_engine, self.teacher, self.teacher_engine_options)
        return self


def teacher_options(name: str, teacher: str | None, raw: dict[str, Any]) -> dict[str, Any]:
    """distill.teacher_engine's options, checked (the engine exists, scores given tokens, its
    options are valid); an engine that takes no weights gets distill.teacher as its base_url."""
    from traingym.rollout import registry

    try:
        cls = registry.get(name)
    except registry.UnknownEngine as e:
        raise ValueError(str(e).replace("rollout.engine", "distill.teacher_engine")) from None
    if not cls.abilities.scores_tokens:
        raise ValueError(f"distill.teacher_engine={name!r} cannot score given tokens (its "
                         "abilities.scores_tokens is False): a teacher must; use "
                         f"{registry._able('scores_tokens')}")
    if not cls.abilities.takes_weights:  # it serves its own model: distill.teacher locates it
        if "base_url" not in cls.Options.model_fields:
            raise ValueError(f"distill.teacher_engine={name!r} takes no weights and has no "
                             "base_url option for distill.teacher to fill: not covered")
        if "base_url" in raw:
            raise ValueError("distill.teacher is the teacher server's URL: set it there, not "
                             "in distill.teacher_engine_options.base_url")
        raw = {**raw, "base_url": teacher}
    try:
        registry.options(name, raw)
    except ValueError as e:
        msg = str(e).replace("rollout.engine_options", "distill.teacher_engine_options")
        if not cls.abilities.takes_weights and "'base_url'" in msg:
            msg = f"distill.teacher={teacher!r} is not a server URL ({msg})"
        raise ValueError(msg) from None
    return raw


def check_teacher_temperature(cfg) -> None:
    """A teacher engine that scores only at T = 1 refuses a run sampling at another T."""
    from traingym.rollout import registry

    name, t = cfg.distill.teacher_engine, cfg.rollout.temperature
    if name is None or cfg.distill.teacher is None or t in (0.0, 1.0):
        return
    if not registry.get(name).abilities.scores_at_any_temperature:
        raise ValueError(f"distill.teacher_engine={name!r} scores only at temperature 1, but "
                         f"rollout.temperature={t:g}: the teacher's log-probs would be of "
                         "softmax(logits), not softmax(logits / T); set rollout.temperature = "
                         f"1 or use {registry._able('scores_at_any_temperature')}")


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
        raise ValueError("distill.coef, reward_coef, teacher_engine and teacher_engine_options "
                         "apply only with distill.teacher (the teacher's model or checkpoint, "
                         "or its server's URL)")
    check_teacher_temperature(cfg)
    if cfg.distill.teacher is not None and (t.data_parallel > 1 or cfg.mode != "sync"):
        raise ValueError("distill.teacher runs with mode='sync' and trainer.data_parallel = 1 "
                         "(distillation with engine processes or ranks is not covered)")
    if cfg.distill.teacher is not None and lora.rank > 0:
        raise ValueError("distill.teacher with lora.rank > 0 is not covered: distil into the "
                         "full model (lora.rank = 0)")
    if t.gradient_checkpointing and t.data_parallel > 1:
        raise ValueError("trainer.gradient_checkpointing runs in one trainer process: set "
                         "trainer.data_parallel = 1")
