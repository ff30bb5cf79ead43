"""The config rules that span sections, checked when a Config is built. Each reads the
sections' values and the components' declared abilities (registries), never names; a
ValueError names the problem and the fix."""

from __future__ import annotations

from traingym.algorithms import registry as algorithms
from traingym.core.registry import one_of
from traingym.models.families import moe_routers
from traingym.models.presets import model_type_of
from traingym.rollout import registry as engines
from traingym.weights import registry as transports


def check(cfg) -> None:
    check_extras(cfg)
    _importance_on(cfg)
    _algorithm_can_run(cfg)
    _async_needs(cfg)
    _routing_replay(cfg)
    _moe_aux_loss(cfg)


def check_teacher_temperature(cfg) -> None:
    """A teacher engine that scores only at T = 1 refuses a run sampling at another T."""
    name, t = cfg.distill.teacher_engine, cfg.rollout.temperature
    if name is None or cfg.distill.teacher is None or t in (0.0, 1.0):
        return
    if not engines.get(name).abilities.scores_at_any_temperature:
        raise ValueError(f"distill.teacher_engine={name!r} scores only at temperature 1, but "
                         f"rollout.temperature={t:g}: the teacher's log-probs would be of "
                         "softmax(logits), not softmax(logits / T); set rollout.temperature = "
                         f"1 or use {engines._able('scores_at_any_temperature')}")


def check_extras(cfg) -> None:
    """Checks across sections for the extras; each ValueError names the problem and the fix."""
    lora, t = cfg.lora, cfg.trainer
    if lora.rank == 0 and ({"alpha", "dropout", "target_modules", "sync", "base_dtype"}
                           & lora.model_fields_set):
        raise ValueError("lora.alpha, dropout, target_modules, sync and base_dtype apply only "
                         "with lora.rank > 0; set lora.rank (e.g. 8)")
    if lora.base_dtype == "bfloat16" and t.bf16_autocast is False:
        raise ValueError("lora.base_dtype='bfloat16' computes the forward in bf16, but "
                         "trainer.bf16_autocast=false asks for float32 compute: set "
                         "lora.base_dtype='float32' (or 'auto'), or trainer.bf16_autocast "
                         "to 'auto' or true")
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


def _importance_on(cfg) -> None:
    a = cfg.algorithm
    off = a.is_correction == "none" or (a.is_correction == "auto" and cfg.mode == "sync")
    if off and {"is_level", "is_cap"} & a.model_fields_set:
        raise ValueError("algorithm.is_level and is_cap apply only with an importance "
                         "correction: set algorithm.is_correction to 'tis' or 'mis' (its "
                         "default 'auto' is none with mode='sync')")
    if a.kl_coef > 0 and a.kl_in == "reward" and cfg.trainer.data_parallel > 1:
        raise ValueError("algorithm.kl_in='reward' shapes advantages over the whole batch "
                         "in one process: use kl_in='loss' or trainer.data_parallel=1")
    if a.entropy_coef > 0 and cfg.trainer.gradient_checkpointing:
        raise ValueError("algorithm.entropy_coef needs the entropy's gradient, which the "
                         "gradient-checkpointing path (trainer/micro.py) does not keep: "
                         "set entropy_coef=0 or trainer.gradient_checkpointing=false")


def _algorithm_can_run(cfg) -> None:
    """What an algorithm declares it needs (algorithms/base.py), against the run's shape."""
    algo = algorithms.get(cfg.algorithm.name)
    name = cfg.algorithm.name
    check = getattr(algo, "check", None)  # an algorithm's own refusals, if it has any
    if check is not None:
        check(cfg)
    if algo.needs_values:  # a value head beside the full model; GAE over the whole batch
        if cfg.trainer.data_parallel > 1:
            raise ValueError(f"algorithm.name={name!r} computes GAE and whitens advantages over "
                             "the whole batch in one process: set trainer.data_parallel = 1")
        if cfg.lora.rank > 0:
            raise ValueError(f"algorithm.name={name!r} with lora.rank > 0 is not covered (the "
                             "value head trains beside the full model): set lora.rank = 0")
        if cfg.distill.teacher is not None:
            raise ValueError(f"algorithm.name={name!r} with distill.teacher is not covered: "
                             "distillation has its own step; drop one of them")
        if cfg.trainer.optimizer_in_backward:
            raise ValueError(f"algorithm.name={name!r} with trainer.optimizer_in_backward is "
                             "not covered (the value head trains beside the model): set "
                             "trainer.optimizer_in_backward = false")


def _routing_replay(cfg) -> None:
    """algorithm.routing_replay needs the engine's routes and the shared-prompt forward."""
    if not cfg.algorithm.routing_replay:
        return
    if not engines.get(cfg.rollout.engine).abilities.reports_routes:
        raise ValueError(f"algorithm.routing_replay replays the experts the engine routed each "
                         f"token to, but rollout.engine={cfg.rollout.engine!r} does not report "
                         f"routes: use {engines._able('reports_routes')}, or set "
                         "algorithm.routing_replay = false")
    if cfg.trainer.gradient_checkpointing:
        raise ValueError("algorithm.routing_replay does not cover "
                         "trainer.gradient_checkpointing (the backward pass recomputes the "
                         "forward outside the replay): turn one of them off")


def _moe_aux_loss(cfg) -> None:
    """algorithm.moe_aux_loss_coef needs an MoE model (known here where model.path is a local
    folder, 'tiny', 'embedded' or a preset; else the trainer refuses a dense model when it
    loads it) and the shared-prompt forward."""
    if cfg.algorithm.moe_aux_loss_coef == 0:
        return
    model_type = model_type_of(cfg.model.path, cfg.model.preset)
    covered = moe_routers()
    if model_type is not None and model_type not in covered:
        raise ValueError(f"algorithm.moe_aux_loss_coef > 0 adds a mixture-of-experts "
                         f"load-balancing loss, but model.path={cfg.model.path!r} is a dense "
                         f"model (model_type {model_type!r}; covered MoE families: "
                         f"{', '.join(sorted(covered))}): set algorithm.moe_aux_loss_coef = 0")
    if cfg.trainer.gradient_checkpointing:
        raise ValueError("algorithm.moe_aux_loss_coef > 0 does not cover "
                         "trainer.gradient_checkpointing (its full-row forward lays positions "
                         "out otherwise): set algorithm.moe_aux_loss_coef = 0 or "
                         "trainer.gradient_checkpointing = false")


def _async_needs(cfg) -> None:
    if cfg.mode == "sync" and cfg.async_.model_fields_set:
        raise ValueError("the 'async' section applies only with mode='async'")
    abilities = transports.get(cfg.weights.transport).abilities
    if cfg.mode == "async" and not abilities.crosses_processes:
        raise ValueError(f"mode='async' runs engines in other processes: weights.transport "
                         f"must be {one_of(transports.able('crosses_processes'))} "
                         f"(or another that crosses processes), not "
                         f"{cfg.weights.transport!r}")
    if cfg.cluster.type == "ray" and cfg.mode != "async":
        raise ValueError("cluster.type='ray' places engines apart from the trainer: it "
                         "needs mode='async'")
    if cfg.cluster.type == "ray" and not abilities.crosses_nodes:
        raise ValueError("cluster.type='ray' sends weights to other nodes: weights.transport"
                         f" must be {one_of(transports.able('crosses_nodes'))} (or "
                         f"another that crosses nodes), not {cfg.weights.transport!r}")
