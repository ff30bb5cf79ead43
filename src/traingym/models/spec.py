"""Model specs: what a string names as a model, and loading it (weights, or the tokenizer only).

A spec is one of:
- "embedded" or "tiny" (models/loader.py), or a Hugging Face model folder (an exported
  checkpoint included);
- a checkpoint folder `RUN/checkpoints/step_N`: committed and verified against its manifest;
  its run's config.json, two levels up, names the base model the weights belong to;
- a run directory: its latest committed checkpoint.

A run's config.json is read as plain JSON (`model.path`, `lora.*`), not validated as a Config:
this layer sits below the config, and a checkpoint needs only its base model and LoRA
settings. A LoRA run's checkpoint holds the adapter-injected state; loading merges it into the
base (models/lora.py). Errors (FileNotFoundError, ConfigError) name the fix.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from pathlib import Path

from traingym.core.errors import ConfigError
from traingym.models.loader import check_model_path, load_policy, resolve_path, tiny_tokenizer
from traingym.models.lora import LoraShape, apply_lora, merged_state
from traingym.runs import checkpoint
from traingym.runs.index import is_run_dir

RUN_CONFIG = "config.json"


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


def run_data(run_dir: Path) -> dict:
    """The run's config.json as plain JSON."""
    path = Path(run_dir) / RUN_CONFIG
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path} is not valid JSON ({e.msg})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path} is not a run's config (not a JSON object)")
    return data


def base_model(run_dir: Path) -> str:
    """The run's model.path: the base model its checkpoints' weights belong to."""
    model = run_data(run_dir).get("model")
    if not isinstance(model, dict) or not isinstance(model.get("path"), str):
        raise ConfigError(f"{Path(run_dir) / RUN_CONFIG} names no model.path, so the base "
                          "model of its checkpoints is unknown")
    return model["path"]


def run_lora(run_dir: Path | None):
    """The run's LoRA settings (a models/lora.py LoraShape), or None for full fine-tuning."""
    if run_dir is None:
        return None
    lora = run_data(run_dir).get("lora") or {}
    if not isinstance(lora, dict) or not lora.get("rank"):
        return None
    known = {k: lora[k] for k in ("rank", "alpha", "dropout") if k in lora}
    if "target_modules" in lora:
        known["target_modules"] = tuple(lora["target_modules"])
    return LoraShape(**known)


def resolve(text: str | Path) -> ModelSpec:
    """The model a spec names (module docstring)."""
    text = str(text)
    if text in ("embedded", "tiny"):
        return ModelSpec(text, text)
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
        return ModelSpec(text, base_model(run_dir), path, run_dir)
    if is_run_dir(path):
        saved = checkpoint.committed(path / "checkpoints")
        if not saved:
            raise FileNotFoundError(f"run {path} has no committed checkpoint yet; wait for one "
                                    "or give its base model")
        return ModelSpec(text, base_model(path), saved[-1], path)
    check_model_path(str(path))  # a model folder (its config.json), or a named error
    return ModelSpec(text, str(path))


def load(spec: str | Path | ModelSpec, seed: int = 0):
    """(fp32 model, tokenizer) for a spec: the base model, with a checkpoint's weights on it."""
    spec = spec if isinstance(spec, ModelSpec) else resolve(spec)
    model, tok = load_policy(spec.model_path, seed=seed)
    if spec.checkpoint is not None:
        load_checkpoint(model, spec.checkpoint, run_lora(spec.run_dir), spec.model_path)
    return model, tok


def load_checkpoint(model, folder: Path, lora=None, model_path: str = "the base model") -> None:
    """Put checkpoint `folder`'s weights into the base `model` (in place). With `lora` (rank >
    0: a LoraShape or the lora section) the checkpoint holds the adapter-injected state: it is
    loaded into an injected copy and merged (W + (alpha/r) B A in float32), which is what the
    run's engine served with lora.sync='merged' (and, with a float32 engine, 'adapter')."""
    from safetensors.torch import load_model

    target = model
    if lora is not None and lora.rank > 0:
        target = apply_lora(copy.deepcopy(model), lora)
    missing, unexpected = load_model(target, str(Path(folder) / "model.safetensors"))
    if missing or unexpected:
        raise ConfigError(f"checkpoint {folder} does not fit model.path={model_path!r} "
                          f"(missing {missing[:3]}, unexpected {unexpected[:3]})")
    if target is not model:
        model.load_state_dict(merged_state(target), strict=True)


def tokenizer(path: str):
    """Only the tokenizer of a model path ('tiny', 'embedded' or a Hugging Face folder), for an
    engine that serves its own weights."""
    folder = resolve_path(path)
    if folder is None:
        return tiny_tokenizer()
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder)
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok
