"""What `traingym eval` evaluates: a model spec, its eval config and rows, the engine, and the
check that eval prompts were not training prompts of the run under test.

A model spec is one of:
- "embedded" or "tiny" (models/loader.py), or a Hugging Face model folder (an exported
  checkpoint included);
- a checkpoint folder `RUN/checkpoints/step_N` (committed and verified against its manifest;
  its run's config.json, two levels up, names the base model the weights belong to);
- a run directory (its latest committed checkpoint);
- "base" inside a comparison: the base model (model.path) of the other side's run.

The eval config is the run's own config for a checkpoint or run directory (so an eval
repeats the run's held-out evaluation: same rows, seed, temperature, samples, token limit),
else the one given (or the default). Eval rows: an explicit dataset, else task.eval_dataset,
else the built-in task's held-out rows (eval.num_prompts of them), cut to eval.num_prompts.

Overlap check: the training rows of a run are those its config names (task.dataset, or the
built-in task split by its eval.num_prompts). A run whose rows came through the Python API
(`train(dataset=...)`) has no record of them but the few examples samples.jsonl keeps per step
(observability/events.py); when those are not among the config's rows, only they are checked
and the summary says the check was partial. Prompts are compared exactly (the row's prompt,
string or message list), not fuzzily.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from traingym.runs import checkpoint
from traingym.config.schema import Config
from traingym.core.errors import ConfigError
from traingym.runs.index import is_run_dir  # noqa: F401 (re-exported)

from traingym.config.load import RUN_CONFIG, run_config, run_config_data  # noqa: F401


@dataclass
class ModelSpec:
    text: str  # as the user gave it
    model_path: str  # what load_policy loads: the base model for a checkpoint
    checkpoint: Path | None = None  # a committed checkpoint folder whose weights are loaded
    run_dir: Path | None = None  # the run the checkpoint belongs to

    def describe(self) -> dict:
        return {"spec": self.text, "model_path": self.model_path,
                "checkpoint": str(self.checkpoint) if self.checkpoint else None,
                "run_dir": str(self.run_dir) if self.run_dir else None}


def resolve_spec(text: str | Path, other: ModelSpec | None = None) -> ModelSpec:
    """The model a spec names (module docstring); FileNotFoundError / ConfigError name the fix."""
    text = str(text)
    if text in ("embedded", "tiny"):
        return ModelSpec(text, text)
    if text == "base":
        if other is None or other.run_dir is None:
            raise ConfigError("'base' means the base model of the other side's run: compare it "
                              "with a checkpoint or run directory (e.g. --compare base RUN_DIR)")
        return ModelSpec(text, run_config(other.run_dir).model.path)
    path = Path(text).expanduser()
    if not path.exists():
        raise FileNotFoundError(f"model {text!r}: no such file or folder; give 'embedded', "
                                "'tiny', a model folder, a run directory or a checkpoint folder")
    if (path / checkpoint.MARKER).exists() or path.name.startswith("step_"):
        try:
            checkpoint.verify(path)
        except (checkpoint.CheckpointError, FileNotFoundError) as e:
            raise ConfigError(f"checkpoint {path}: {e}; use a committed checkpoint") from None
        run_dir = path.parent.parent
        if not is_run_dir(run_dir):
            raise FileNotFoundError(f"checkpoint {path}: its run's config.json ({run_dir}/"
                                    f"{RUN_CONFIG}) is missing, so its base model is unknown; "
                                    "keep checkpoints inside their run directory")
        return ModelSpec(text, run_config(run_dir).model.path, path, run_dir)
    if is_run_dir(path):
        saved = checkpoint.committed(path / "checkpoints")
        if not saved:
            raise FileNotFoundError(f"run {path} has no committed checkpoint yet; wait for one "
                                    "or give its base model")
        return ModelSpec(text, run_config(path).model.path, saved[-1], path)
    from traingym.models.loader import check_model_path

    check_model_path(str(path))  # a model folder (its config.json), or a named error
    return ModelSpec(text, str(path))


def prompt_key(row: dict) -> str:
    return json.dumps(row["prompt"], sort_keys=True, ensure_ascii=False)


def eval_rows(cfg: Config, dataset=None) -> list[dict]:
    """The rows to evaluate on (module docstring)."""
    from traingym.envs import adapters
    from traingym.envs.datasets import load_rows, validate_rows
    from traingym.envs.tasks import builtin_task

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
    from traingym.envs import adapters
    from traingym.envs.datasets import load_rows
    from traingym.envs.tasks import builtin_task

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
    """(engine, tokenizer) for `spec` through the engine registry. An engine that takes no
    weights (a read-only endpoint, e.g. rollout.engine='openai') gets no model (None): it
    serves its own weights, and a checkpoint or run spec then names only the run's config,
    tokenizer and training rows (`weights_source` says so in the eval summary)."""
    from traingym.models.loader import load_policy
    from traingym.rollout import registry

    try:
        cls = registry.get(cfg.rollout.engine)
        options = registry.options(cfg.rollout.engine, cfg.rollout.engine_options)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    if not cls.abilities.takes_weights:
        tok = _tokenizer(cfg.model.path)
        return cls.from_config(cfg, None, tok, options), tok
    model, tok = load_policy(cfg.model.path, seed=cfg.seed)
    if spec.checkpoint is not None:
        load_weights(model, cfg, spec.checkpoint)
    return cls.from_config(cfg, model, tok, options), tok


def weights_source(cfg: Config, spec: ModelSpec) -> str:
    from traingym.rollout import registry

    if not registry.get(cfg.rollout.engine).abilities.takes_weights:
        return (f"the endpoint's own (rollout.engine={cfg.rollout.engine!r} takes no weights; "
                f"{spec.text} gave the config, tokenizer and training rows only)")
    return str(spec.checkpoint) if spec.checkpoint is not None else cfg.model.path


def load_weights(model, cfg: Config, folder: Path) -> None:
    """Put checkpoint `folder`'s weights into the base `model` (in place). A LoRA run's
    checkpoint (lora.rank > 0) holds the adapter-injected state: it is loaded into an injected
    copy and merged (W + (alpha/r) B A in float32, trainer/lora.py merged_state), which is what
    the run's engine served with lora.sync='merged' (and, with a float32 engine, 'adapter')."""
    from safetensors.torch import load_model

    lora = getattr(cfg, "lora", None)
    target = model
    if lora is not None and lora.rank > 0:
        import copy

        from traingym.trainer.lora import apply_lora

        target = apply_lora(copy.deepcopy(model), lora)
    missing, unexpected = load_model(target, str(folder / "model.safetensors"))
    if missing or unexpected:
        raise ConfigError(f"checkpoint {folder} does not fit model.path={cfg.model.path!r} "
                          f"(missing {missing[:3]}, unexpected {unexpected[:3]})")
    if target is not model:
        from traingym.trainer.lora import merged_state

        model.load_state_dict(merged_state(target), strict=True)


def _tokenizer(path: str):
    from traingym.models.loader import resolve_path, tiny_tokenizer

    folder = resolve_path(path)
    if folder is None:
        return tiny_tokenizer()
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder)
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


def make_factory(cfg: Config, tokenizer, reward: Callable | None, env, group_reward,
                 custom_rows: bool = False):
    """(env factory, group hook) as the run builds them (run.py _assemble)."""
    from traingym.envs.multi_turn import BoundFactory
    from traingym.envs.render import PromptRenderer
    from traingym.envs.single_turn import SingleTurnFactory
    from traingym.envs.tasks import exact_answer
    from traingym.loop.inputs import import_reward, resolve_env

    env, group_reward = resolve_env(cfg, env, group_reward)
    if env is not None and reward is not None:
        raise ConfigError("pass either reward= (single-turn) or env= (the env scores its own "
                          "episodes), not both")
    renderer = PromptRenderer(tokenizer, cfg.task.prefill, cfg.task.system_prompt)
    if env is not None:
        return BoundFactory(env, renderer), group_reward
    if reward is None:
        if cfg.task.reward:
            reward = import_reward(cfg.task.reward)
        elif not custom_rows and cfg.task.dataset is None and cfg.task.eval_dataset is None:
            reward = exact_answer
        else:
            raise ConfigError("a custom dataset needs a reward: pass reward= (--reward "
                              "module:function) or set task.reward")
    return SingleTurnFactory(reward, renderer), group_reward
