"""The run's trainer from its config: one process (TorchTrainer), or data-parallel ranks
(DistributedTrainer) when `trainer.data_parallel > 1`; either applies the importance correction
that `algorithm.is_correction` resolves to (algorithms/importance.py: ImportanceSpec) and the
run's algorithm (`algorithm.name`, algorithms/registry.py)."""

from __future__ import annotations

from traingym.config.schema import Config


def build_trainer(cfg: Config, model, pad_token_id: int):
    if cfg.trainer.data_parallel > 1:
        from traingym.trainer.distributed import DistributedTrainer

        return DistributedTrainer(model, cfg, pad_token_id)
    from traingym.algorithms import registry
    from traingym.algorithms.importance import ImportanceSpec
    from traingym.trainer.torch_trainer import TorchTrainer

    cls, extra = TorchTrainer, {}
    if cfg.lora.rank > 0:  # adapters only (trainer/lora.py)
        from traingym.trainer.lora import LoraTrainer

        cls, extra = LoraTrainer, {"lora": cfg.lora}
    if cfg.distill.teacher is not None:  # on-policy distillation (algorithms/distill.py)
        from traingym.algorithms.distill import (DistillTrainer, build_teacher_engine,
                                                 load_teacher)

        d = cfg.distill
        teacher = (build_teacher_engine(cfg, model.config.vocab_size) if d.teacher_engine
                   else load_teacher(d.teacher, cfg.model.path, cfg.seed))
        cls, extra = DistillTrainer, {"teacher": teacher, "coef": d.coef,
                                      "reward_coef": d.reward_coef}
    return cls(model, cfg.trainer, cfg.rollout.temperature, pad_token_id,
                        importance=ImportanceSpec.from_config(cfg),
                        algorithm=registry.build(cfg), **extra)
