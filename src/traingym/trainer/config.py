"""The trainer's config sections: `trainer` (optimizer, micro-batches, data parallelism) and
the extras `lora`, `sft` and `distill`, each off by default (`lora.rank = 0`,
`sft.data = None`, `distill.teacher = None`)."""

from __future__ import annotations

import importlib.util
from typing import Any, Literal

from pydantic import Field, model_validator

from traingym.core.errors import Strict


class TrainerConfig(Strict):
    lr: float = Field(1e-5, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    betas: tuple[float, float] = (0.9, 0.99)
    grad_clip: float = Field(1.0, ge=0, description="max global grad norm; 0: no clipping "
                             "(grad_norm is still reported)")
    optimizer: Literal["adamw", "adamw_8bit"] = Field(
        "adamw", description="'adamw': torch's AdamW (fp32 moments: 8 bytes per parameter); "
        "'adamw_8bit': bitsandbytes' AdamW8bit, both moments block-wise quantized to 8 bits "
        "(about 2 bytes per parameter; tensors under 4096 values keep fp32 moments), close to "
        "AdamW but not equal; needs the `memory` extra (pip install 'traingym[memory]') and "
        "data_parallel = 1; slower than 'adamw' on a CPU (trainer/optimizers.py)")
    optimizer_in_backward: bool = Field(
        False, description="step each parameter inside the backward pass as soon as its "
        "gradient is complete, then free that gradient, so the whole model's gradients never "
        "exist at once; the update is the optimizer's usual one. Needs grad_clip = 0, "
        "micro_batch_tokens = 0 and data_parallel = 1, and no value head (algorithm 'ppo'): "
        "the whole batch is one forward/backward pass (micro_batch_groups is ignored; "
        "gradient_checkpointing bounds its activations). A non-finite gradient is seen only "
        "after the parameters took it: the step raises and the run resumes from a checkpoint")
    micro_batch_groups: int = Field(4, ge=1, description="groups per forward/backward pass")
    emit_changes: bool = Field(
        False, description="the optimizer step records which of the engine's (narrower-dtype) "
        "values it changes, and their values, so the delta weight sync reads neither state "
        "instead of comparing the whole model; weights and moments are bitwise the same "
        "(trainer/step_changes.py). Off by default: on a CPU the record costs the step more "
        "than it saves the sync (benchmarks/step_changes.py). Applies to "
        "'adamw' stepped after the backward pass on one rank, not LoRA")
    bf16_autocast: bool | Literal["auto"] = Field(
        "auto", description="bf16 autocast for forward/backward (master weights and optimizer "
        "stay fp32); 'auto': on where the device has fast bf16 kernels (precision.py)")
    data_parallel: int = Field(1, ge=1, description="trainer ranks (world size): rank 0 in "
                               "this process, the others local processes (cluster.type "
                               "'local') or Ray actors ('ray'); each trains on whole groups "
                               "of the batch, gloo on CPU (trainer/distributed.py)")
    parallelism: Literal["ddp", "fsdp2"] = Field(
        "ddp", description="with data_parallel > 1: 'ddp' (a replica per rank, gradients "
        "all-reduced) or 'fsdp2' (torch fully_shard: parameters and optimizer state sharded)")
    dist_timeout_s: float = Field(300.0, gt=0, description="with data_parallel > 1: a rank "
                                  "that does not answer (or a collective that does not "
                                  "finish) within this long fails the step")
    gradient_checkpointing: bool = Field(False, description="recompute each decoder layer in "
                                         "the backward pass (less memory, more compute; the "
                                         "trainer then runs full sequences: trainer/micro.py)")
    trim_memory: bool = Field(
        True, description="give the heap's free pages back to the system after each rollout, "
        "forward/backward pass and step (malloc_trim, core/memory.py): a lower peak RSS, but "
        "every phase then faults its pages in again, a cost that grows with the batch and "
        "shows on small models (BENCHMARKS.md, 'Page faults'); false: keep them for reuse, "
        "as a plain torch loop does")
    micro_batch_tokens: int = Field(0, ge=0, description="cap on tokens per forward/backward "
                                    "pass, splitting groups by samples (trainer/micro.py); 0: "
                                    "micro-batches of micro_batch_groups whole groups")

    @model_validator(mode="after")
    def _optimizer(self) -> TrainerConfig:
        if self.optimizer == "adamw_8bit":
            if importlib.util.find_spec("bitsandbytes") is None:
                raise ValueError("trainer.optimizer='adamw_8bit' needs the bitsandbytes "
                                 "package, which is not installed: pip install "
                                 "'traingym[memory]' (or use trainer.optimizer='adamw')")
            if self.data_parallel > 1:
                raise ValueError("trainer.optimizer='adamw_8bit' runs in one trainer process "
                                 "(8-bit moments with data-parallel ranks are not covered): "
                                 "set trainer.data_parallel = 1 or trainer.optimizer='adamw'")
        if not self.optimizer_in_backward:
            return self
        fixes = [fix for bad, fix in (
            (self.grad_clip > 0, "trainer.grad_clip = 0 (clipping needs every gradient "
                                 "before any step)"),
            (self.micro_batch_tokens > 0, "trainer.micro_batch_tokens = 0 (a step is one "
                                          "backward pass)"),
            (self.data_parallel > 1, "trainer.data_parallel = 1 (ranks add up their "
                                     "gradients after their backward passes)")) if bad]
        if fixes:
            raise ValueError("trainer.optimizer_in_backward steps each parameter during the "
                             "step's one backward pass: set " + "; ".join(fixes))
        return self

    @model_validator(mode="after")
    def _parallel(self) -> TrainerConfig:
        if self.data_parallel == 1:
            if {"parallelism", "dist_timeout_s"} & self.model_fields_set:
                raise ValueError("trainer.parallelism and dist_timeout_s apply only with "
                                 "trainer.data_parallel > 1")
            return self
        import torch.distributed as dist

        if not dist.is_available():
            raise ValueError("trainer.data_parallel > 1 needs torch.distributed, which this "
                             "torch build lacks")
        if self.parallelism == "fsdp2":
            try:
                from torch.distributed.fsdp import fully_shard  # noqa: F401
            except ImportError as e:
                raise ValueError("trainer.parallelism='fsdp2' needs torch.distributed.fsdp."
                                 f"fully_shard (torch >= 2.6); this torch has none: {e}") from e
        return self


class LoraConfig(Strict):
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
    base_dtype: Literal["float32", "bfloat16", "auto"] = Field(
        "float32", description="dtype of the frozen base (every non-adapter parameter); the "
        "adapters and their AdamW state stay float32. 'bfloat16' halves the base's memory (the "
        "forward then computes in bf16, as under trainer.bf16_autocast, residual stream "
        "included); 'auto': bfloat16 where trainer.bf16_autocast is on")


class SftConfig(Strict):
    """Supervised warm start on chat data before the RL steps (trainer/sft.py)."""

    data: str | None = Field(None, description="a JSONL file of {'messages': [...]} rows or a "
                             "local `datasets` folder; None: no SFT phase")
    epochs: float = Field(1.0, gt=0, description="passes over the data (used when steps = 0)")
    steps: int = Field(0, ge=0, description="optimizer steps of the SFT phase; 0: from epochs")
    batch_size: int = Field(8, ge=1, description="conversations per SFT step")
    lr: float = Field(1e-4, gt=0, description="learning rate of the SFT phase")
    checkpoint_every: int = Field(0, ge=0, description="checkpoint every N SFT steps (0: only "
                                  "at the end of the phase)")


class DistillConfig(Strict):
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
    from traingym.rollout import registry  # heavy: safetensors, torch

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
