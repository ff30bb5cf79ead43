"""What `traingym serve CHECKPOINT_OR_MODEL` serves, and the engine that serves it.

The argument is a checkpoint folder (runs/checkpoint.py, verified against its manifest), a run
directory (its newest committed checkpoint), a local Hugging Face folder, 'embedded' or 'tiny'.
The engine is built through the engine seam (`rollout.registry.build`) from the run's config
plus `--set` overrides; weights load as models/spec.py loads a checkpoint (LoRA merged).
Not covered: serving adapters unmerged, several models in one server.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from traingym.config.engines import engine_context
from traingym.config.load import _merge, build_config, parse_overrides
from traingym.core.errors import ConfigError
from traingym.models import spec as model_spec
from traingym.models.families import stop_token_ids
from traingym.models.loader import check_model_path, load_policy
from traingym.rollout.registry import build
from traingym.runs import checkpoint


@dataclass
class Served:
    name: str  # the model id clients send and /v1/models lists
    source: str  # what was loaded, for the start-up line
    engine: Any  # a RolloutEngine
    tokenizer: Any
    context_len: int | None  # the model's position limit (prompt + completion), if it has one
    stop_ids: tuple[int, ...]


def _run_config(run_dir: Path, overrides: list[str]):
    """The default config with the run's model, seed and engine settings (all that serving
    reads), so a run written by an older traingym, whose other keys have moved since, still
    serves; `overrides` go on top."""

    path = run_dir / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"{run_dir} has no config.json, so the checkpoint's model is "
                                "unknown; give the run's checkpoint folder as written by "
                                "`traingym train` (RUN/checkpoints/step_N)")
    try:
        data = json.loads(path.read_text())
        rollout = data.get("rollout", {})
        kept = {"seed": data.get("seed", 0), "model": data["model"], "rollout": {
            k: rollout[k] for k in ("engine", "engine_options", "max_batch_rows")
            if k in rollout}}
    except (json.JSONDecodeError, KeyError, AttributeError, TypeError) as e:
        raise ConfigError(f"{path} does not describe a run's model ({type(e).__name__}: {e})") \
            from None
    return build_config("default", None, _merge(kept, parse_overrides(overrides)))


def resolve(arg: str) -> tuple[str, Path | None, Path | None]:
    """(kind, checkpoint folder, run dir): kind is 'checkpoint' or 'model'."""

    if arg in ("tiny", "embedded"):
        return "model", None, None
    folder = Path(arg).expanduser()
    if not folder.exists():
        raise FileNotFoundError(f"{arg!r} does not exist; give a run's checkpoint folder, a run "
                                "directory, a Hugging Face model folder, 'embedded' or 'tiny'")
    if folder.name.startswith("step_") and folder.parent.name == "checkpoints":
        return "checkpoint", folder, folder.parent.parent
    if (folder / "checkpoints").is_dir():
        saved = checkpoint.committed(folder / "checkpoints")
        if not saved:
            raise FileNotFoundError(f"run directory {folder} has no committed checkpoint yet; "
                                    "serve it after its first checkpoint, or serve its model")
        return "checkpoint", saved[-1], folder
    return "model", None, None


def load(arg: str, overrides: list[str] | None = None, name: str | None = None) -> Served:
    overrides = list(overrides or [])
    kind, ckpt, run_dir = resolve(arg)
    if kind == "checkpoint":
        cfg = _run_config(run_dir, overrides)
        checkpoint.verify(ckpt)  # CheckpointError names the file that does not match
        model, tok = model_spec.load(model_spec.ModelSpec(arg, cfg.model.path, ckpt, run_dir),
                                     seed=cfg.seed)
        source = f"checkpoint {ckpt} of the run in {run_dir} (model.path={cfg.model.path!r})"
        default_name = f"{run_dir.name}/{ckpt.name}"
    else:
        check_model_path(arg)
        cfg = build_config("default", None, [f"model.path={arg}", *overrides])
        model, tok = load_policy(cfg.model.path, seed=cfg.seed)
        source = f"model {arg}"
        default_name = arg if arg in ("tiny", "embedded") else Path(arg).expanduser().name
    context = getattr(model.config, "max_position_embeddings", None)
    engine, _ = build(engine_context(cfg), model, tok)
    stop = stop_token_ids(tok)
    return Served(name or default_name, source, engine, tok, context, stop)
