"""`traingym export CHECKPOINT OUT`: a checkpoint as a plain Hugging Face model folder.

CHECKPOINT is a committed checkpoint folder (verified against its manifest) or a run directory
(its latest committed checkpoint). The run's config names the base model; its architecture and
tokenizer are loaded as the run loaded them (models/loader.py), the checkpoint's weights put in,
and the folder written by transformers' own writers: `model.safetensors` (+ index when sharded)
and `config.json` (save_pretrained), the tokenizer files with the chat template
(tokenizer.save_pretrained), and `generation_config.json` (the base model's own where it has
one, else end-of-turn, padding and start tokens from the tokenizer). Nothing traingym-specific
is added, so `AutoModelForCausalLM.from_pretrained(OUT)`, `AutoTokenizer.from_pretrained(OUT)`
and vLLM load it unchanged. The folder is written under a temporary name beside OUT and renamed
into place at the end; an OUT that exists and is not empty is refused.

Weights are written in the checkpoint's dtype (float32 master weights) unless `dtype` says
otherwise ("bfloat16", "float16"). Not covered: LoRA adapters, sharding options, pushing to a hub.
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

    from traingym.eval.specs import (  # heavy: safetensors, torch
        load_weights,
        resolve_spec,
        run_config,
    )
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
    load_weights(model, cfg, spec.checkpoint)  # a LoRA run's: merged (eval_specs.py)
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
