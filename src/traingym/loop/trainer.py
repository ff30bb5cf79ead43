"""The run's algorithm and trainer from its whole config: the composition step, so the algorithm
and trainer layers take only the sections they read.

`build_trainer`: one process (trainer/torch_trainer.py TorchTrainer, or LoraTrainer with
`lora.rank > 0`) or data-parallel ranks (trainer/distributed.py DistributedTrainer,
`trainer.data_parallel > 1`), given the run's algorithm (`build_algorithm`), the importance
correction (algorithms/importance.py ImportanceSpec) and, with `distill.teacher`, the teacher
(trainer/teacher.py); the distillation step takes no importance correction.
"""

from __future__ import annotations

from traingym.algorithms import registry
from traingym.algorithms.distill import distilling
from traingym.algorithms.importance import ImportanceSpec
from traingym.config.schema import Config
from traingym.trainer.teacher import build_teacher


def build_algorithm(cfg: Config):
    """The run's algorithm from its section and rollout.max_new_tokens; with distill.teacher,
    distilling (algorithms/distill.py: the teacher scores every group)."""
    cls = registry.get(cfg.algorithm.name)
    if cfg.distill.teacher is not None:
        cls = distilling(cls, cfg.distill.coef, cfg.distill.reward_coef)
    return cls.from_section(cfg.algorithm, cfg.rollout.max_new_tokens)


def build_trainer(cfg: Config, model, pad_token_id: int):
    algorithm = build_algorithm(cfg)
    importance = ImportanceSpec.from_section(cfg.algorithm, cfg.mode)
    if cfg.trainer.data_parallel > 1:
        from traingym.trainer.distributed import DistributedTrainer  # heavy: transformers

        return DistributedTrainer(model, cfg.trainer, cfg.cluster, cfg.rollout.temperature,
                                  pad_token_id, importance=importance, algorithm=algorithm,
                                  threads=cfg.threads)
    from traingym.trainer.torch_trainer import TorchTrainer  # heavy: transformers

    cls, extra = TorchTrainer, {}
    if cfg.lora.rank > 0:  # adapters only (trainer/lora.py)
        from traingym.trainer.lora import LoraTrainer  # heavy: transformers

        cls, extra = LoraTrainer, {"lora": cfg.lora}
    if cfg.distill.teacher is not None:  # on-policy distillation (algorithms/distill.py)
        importance = None
        extra["teacher"] = build_teacher(cfg.distill, cfg.model.path, model.config.vocab_size,
                                         cfg.seed, cfg.model.engine_dtype,
                                         cfg.rollout.max_batch_rows)
    return cls(model, cfg.trainer, cfg.rollout.temperature, pad_token_id,
               importance=importance, algorithm=algorithm, **extra)
