"""`traingym export CHECKPOINT OUT`: a checkpoint as a plain Hugging Face model folder.

CHECKPOINT is a committed checkpoint (verified against its manifest) or a run directory (its
latest). The base model is loaded as the run loaded it (models/loader.py), the weights put in,
and everything written by transformers' own writers with nothing traingym-specific, so
`from_pretrained` and vLLM load it unchanged. Written beside OUT and renamed into place; a
non-empty OUT is refused. Weights keep the checkpoint's dtype (float32) unless `dtype` says.
Not covered: LoRA adapters, sharding options, pushing to a hub.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from traingym.core.errors import ConfigError

DTYPES = ("float32", "bfloat16", "float16")


def export(source: str | Path, out: str | Path, dtype: str | None = None) -> Path:
    """Write `source`'s weights as a Hugging Face folder at `out`; return `out`."""
    import torch
    from transformers import GenerationConfig

    from traingym.config.load import run_config  # heavy: safetensors, torch
    from traingym.eval.specs import load_weights, resolve_spec  # heavy: safetensors, torch
    from traingym.models.loader import load_policy, resolve_path  # heavy: torch

    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise FileExistsError(f"export: {out} exists and is not empty; give a new or empty "
                              "folder (export never overwrites)")
    if dtype is not None and dtype not in DTYPES:
        raise ConfigError(f"export: dtype {dtype!r} is not one of {list(DTYPES)}")
    spec = resolve_spec(source)
    if spec.checkpoint is None:
        raise FileNotFoundError(f"export: {source} is not a checkpoint folder or run directory; "
                                "give RUN_DIR/checkpoints/step_N or a run directory")
    cfg = run_config(spec.run_dir)
    model, tok = load_policy(cfg.model.path, seed=cfg.seed)
    load_weights(model, cfg, spec.checkpoint)  # a LoRA run's: merged (eval/specs.py)
    if dtype is not None:
        model.to(getattr(torch, dtype))
    base = resolve_path(cfg.model.path)
    if base is not None and (base / "generation_config.json").is_file():
        gen = GenerationConfig.from_pretrained(base)
    else:
        gen = GenerationConfig(eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                               bos_token_id=tok.bos_token_id)
    tmp = out.parent / f".{out.name}.export-tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        model.generation_config = gen
        model.save_pretrained(tmp, safe_serialization=True)
        tok.save_pretrained(tmp)
        if out.exists():
            out.rmdir()  # empty (checked above)
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out
