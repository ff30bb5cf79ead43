"""What `traingym eval` evaluates: a model spec, its eval config and rows, the engine, and the
check that eval prompts were not training prompts of the run under test.

A model spec is anything models/spec.py resolves, or "base" (the other side's base model) in a
comparison. A checkpoint or run directory brings its own config, so an eval repeats the run's
held-out evaluation. Overlap is checked exactly (not fuzzily) against the rows the run's config
names; a run fed through the Python API has only the per-step examples in samples.jsonl, and
the summary then says the check was partial.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

from traingym.config.engines import engine_context
from traingym.config.load import run_config
from traingym.config.schema import Config
from traingym.core.errors import ConfigError
from traingym.envs import adapters
from traingym.envs.datasets import load_rows, validate_rows
from traingym.envs.factory import episode_factory
from traingym.envs.tasks import builtin_task, exact_answer
from traingym.loop.inputs import import_reward, resolve_env
from traingym.models import spec as model_spec
from traingym.models.spec import ModelSpec
from traingym.rollout import registry


def resolve_spec(text: str | Path, other: ModelSpec | None = None) -> ModelSpec:
    """The model a spec names (module docstring; models/spec.py `resolve` for all but
    'base'); FileNotFoundError / ConfigError name the fix."""
    if str(text) == "base":
        if other is None or other.run_dir is None:
            raise ConfigError("'base' means the base model of the other side's run: compare it "
                              "with a checkpoint or run directory (e.g. --compare base RUN_DIR)")
        return ModelSpec("base", model_spec.base_model(other.run_dir))
    return model_spec.resolve(text)


def prompt_key(row: dict) -> str:
    return json.dumps(row["prompt"], sort_keys=True, ensure_ascii=False)


def eval_rows(cfg: Config, dataset=None) -> list[dict]:
    """The rows to evaluate on (module docstring)."""

    t, n = cfg.task, cfg.eval.num_prompts
    if n < 1:
        raise ConfigError("eval.num_prompts=0: nothing to evaluate; set eval.num_prompts >= 1")
    if dataset is not None:
        rows = load_rows(dataset, t.columns)[:n]
    elif t.eval_dataset is not None:
        rows = load_rows(t.eval_dataset, t.columns)[:n]
    elif t.dataset is not None and t.eval_split is not None:
        rows = load_rows(t.dataset, t.columns, t.eval_split)[:n]
    elif t.dataset is not None:
        raise ConfigError("task.dataset has no held-out rows here: give the eval rows "
                          "(--dataset / dataset=, task.eval_dataset, or task.eval_split)")
    elif (env_rows := adapters.rows(t.env, t.env_args, n)) is not None:  # e.g. verifiers
        rows = env_rows[1]
    else:
        rows = builtin_task(t.name, num_heldout=n).heldout
    validate_rows(rows, ("prompt",), "eval dataset")
    return rows


def training_rows(run_dir: Path) -> tuple[list[dict], str]:
    """(the run's training rows as far as they are known, how they are known)."""

    cfg = run_config(run_dir)
    if cfg.task.dataset is not None:
        rows = load_rows(cfg.task.dataset, cfg.task.columns, cfg.task.split)
        how = f"task.dataset {cfg.task.dataset}"
    elif (env_rows := adapters.rows(cfg.task.env, cfg.task.env_args,
                                    cfg.eval.num_prompts)) is not None:  # e.g. verifiers
        rows = env_rows[0]
        how = f"env {cfg.task.env} split by eval.num_prompts={cfg.eval.num_prompts}"
    else:
        rows = builtin_task(cfg.task.name, num_heldout=cfg.eval.num_prompts).train
        how = f"built-in task {cfg.task.name!r} split by eval.num_prompts={cfg.eval.num_prompts}"
    seen = []
    samples = run_dir / "samples.jsonl"
    if samples.exists():
        seen = [json.loads(ln)["example"] for ln in samples.read_text().splitlines() if ln.strip()]
    known = {prompt_key(r) for r in rows}
    if any("prompt" in r and prompt_key(r) not in known for r in seen):
        return ([r for r in seen if "prompt" in r],
                "partial: the run's rows did not come from its config (train(dataset=...)); "
                "only the examples in its samples.jsonl were checked")
    return rows, how


def check_overlap(rows: list[dict], spec: ModelSpec, allow: bool) -> dict:
    """Refuse (ConfigError) when eval prompts were training prompts of the spec's run."""
    if spec.run_dir is None:
        return {"checked": False, "why": "not a checkpoint of a run"}
    train, how = training_rows(spec.run_dir)
    train_keys = {prompt_key(r) for r in train}
    shared = [r for r in rows if prompt_key(r) in train_keys]
    record = {"checked": True, "run_dir": str(spec.run_dir), "training_rows": how,
              "overlapping_prompts": len(shared)}
    if shared and not allow:
        raise ConfigError(
            f"{len(shared)} of {len(rows)} eval prompts were training prompts of run "
            f"{spec.run_dir} ({how}), e.g. {shared[0]['prompt']!r}: held-out reward would be "
            "inflated. Evaluate on held-out rows (the run's own: leave eval.num_prompts and the "
            "dataset as the run had them), or pass --allow-overlap to measure training prompts "
            "on purpose")
    return record


def build_engine_for(cfg: Config, spec: ModelSpec) -> tuple[Any, Any]:
    """(engine, tokenizer) for `spec` through the engine registry (rollout/registry.py
    `build`, from the eval config's EngineContext). An engine that takes no weights (a
    read-only endpoint, e.g. rollout.engine='openai') gets no model (None): it serves its own
    weights, and a checkpoint or run spec then names only the run's config, tokenizer and
    training rows (`weights_source` says so in the eval summary)."""
    ctx = engine_context(cfg)
    try:
        cls = registry.get(ctx.engine)
        registry.options(ctx.engine, ctx.options)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    if not cls.abilities.takes_weights:
        return registry.build(ctx, tokenizer=model_spec.tokenizer(cfg.model.path))
    # the spec is resolved (its checkpoint verified) already: load it, not ctx.model again
    model, tok = model_spec.load(ModelSpec(spec.text, cfg.model.path, spec.checkpoint,
                                           spec.run_dir), seed=cfg.seed)
    return registry.build(ctx, model, tok)


def weights_source(cfg: Config, spec: ModelSpec) -> str:
    if not registry.get(cfg.rollout.engine).abilities.takes_weights:
        return (f"the endpoint's own (rollout.engine={cfg.rollout.engine!r} takes no weights; "
                f"{spec.text} gave the config, tokenizer and training rows only)")
    return str(spec.checkpoint) if spec.checkpoint is not None else cfg.model.path


def load_weights(model, cfg: Config, folder: Path) -> None:
    """Put checkpoint `folder`'s weights into the base `model` (in place), a LoRA run's
    (cfg.lora.rank > 0) merged (models/spec.py `load_checkpoint`)."""
    model_spec.load_checkpoint(model, folder, getattr(cfg, "lora", None), cfg.model.path)


def make_factory(cfg: Config, tokenizer, reward: Callable | None, env, group_reward,
                 custom_rows: bool = False):
    """(env factory, group hook) as the run builds them (envs/factory.py)."""

    env, group_reward = resolve_env(cfg, env, group_reward)
    if env is not None and reward is not None:
        raise ConfigError("pass either reward= (single-turn) or env= (the env scores its own "
                          "episodes), not both")
    t = cfg.task
    if env is None and reward is None:
        if cfg.task.reward:
            reward = import_reward(cfg.task.reward)
        elif not custom_rows and cfg.task.dataset is None and cfg.task.eval_dataset is None:
            reward = exact_answer
        else:
            raise ConfigError("a custom dataset needs a reward: pass reward= (--reward "
                              "module:function) or set task.reward")
    return episode_factory(tokenizer, t.prefill, t.system_prompt, env, reward), group_reward
