"""Checkpoints on disk, safetensors only: `tinker://<run>/weights/<name>` (training state:
trainable tensors and AdamW state) and `tinker://<run>/sampler_weights/<name>` (the weights a
sampler serves: adapters for LoRA, every tensor for full fine-tuning).

Each lives in `<runs_dir>/<run>/<kind>/<name>/`: model.safetensors, optimizer.safetensors and
optimizer.json (training), meta.json (base model, LoRA settings), manifest.json (sha256 of
each file) and COMMITTED written last, as runs/checkpoint.py writes a run's checkpoints; a
folder without the marker or not matching its manifest is never loaded. Names are restricted
to [A-Za-z0-9._-] so a path cannot leave the runs folder.
"""

from __future__ import annotations

import json
import re
import shutil
from datetime import UTC, datetime
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from traingym.runs.checkpoint import MARKER, _join_optimizer, _sha256, _split_optimizer, verify
from traingym.tinker.futures import UserError

KINDS = {"weights": "training", "sampler_weights": "sampler"}
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_RUN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9:_-]{0,199}$")


def run_folder(root: Path, run: str) -> Path:
    if not _RUN.match(run):
        raise UserError(f"training run id {run!r} is not one this server makes")
    return root / run.replace(":", "-")


def parse(path: str) -> tuple[str, str, str]:
    """'tinker://<run>/<kind>/<name>' -> (run, kind, name); UserError otherwise."""
    if not path.startswith("tinker://"):
        raise UserError(f"path {path!r}: expected tinker://<run>/weights/<name>")
    parts = path[len("tinker://"):].split("/")
    if len(parts) != 3 or parts[1] not in KINDS or not _NAME.match(parts[2]) \
            or not _RUN.match(parts[0]):
        raise UserError(f"path {path!r}: expected tinker://<run>/weights/<name> or "
                        "tinker://<run>/sampler_weights/<name>")
    return parts[0], parts[1], parts[2]


def check_name(name: str) -> str:
    if not _NAME.match(name):
        raise UserError(f"checkpoint name {name!r}: use letters, digits, '.', '_' and '-' "
                        "(up to 128)")
    return name


def save(root: Path, run: str, kind: str, name: str, tensors: dict[str, torch.Tensor],
         meta: dict, optimizer: torch.optim.Optimizer | None = None,
         overwrite: bool = False) -> str:
    final = run_folder(root, run) / kind / check_name(name)
    if final.exists() and not overwrite:
        raise UserError(f"checkpoint tinker://{run}/{kind}/{name} exists; pick another name "
                        "(or overwrite=True)")
    tmp = final.parent / f".tmp-{name}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save_file({k: v.detach().contiguous() for k, v in tensors.items()},
              str(tmp / "model.safetensors"))
    if optimizer is not None:
        opt_tensors, opt_scalars = _split_optimizer(optimizer.state_dict())
        save_file(opt_tensors, str(tmp / "optimizer.safetensors"))
        (tmp / "optimizer.json").write_text(json.dumps(opt_scalars))
    (tmp / "meta.json").write_text(json.dumps(meta, indent=1))
    manifest = {p.name: _sha256(p) for p in sorted(tmp.iterdir())}
    (tmp / "manifest.json").write_text(json.dumps(manifest, indent=1))
    (tmp / MARKER).write_text("ok\n")
    if final.exists():
        shutil.rmtree(final)
    tmp.rename(final)
    return f"tinker://{run}/{kind}/{name}"


def open_checkpoint(root: Path, path: str) -> tuple[Path, dict]:
    """(folder, meta) of a committed, verified checkpoint; UserError when there is none."""
    run, kind, name = parse(path)
    folder = run_folder(root, run) / kind / name
    if not (folder / MARKER).is_file():
        raise UserError(f"no checkpoint at {path}")
    try:
        verify(folder)
    except Exception as e:
        raise UserError(f"checkpoint {path} is damaged: {e}") from None
    return folder, json.loads((folder / "meta.json").read_text())


def load_tensors(folder: Path) -> dict[str, torch.Tensor]:
    return load_file(str(folder / "model.safetensors"))


def load_optimizer(folder: Path, optimizer: torch.optim.Optimizer) -> None:
    if not (folder / "optimizer.json").is_file():
        raise UserError(f"{folder.name} holds no optimizer state (a sampler checkpoint?)")
    scalars = json.loads((folder / "optimizer.json").read_text())
    optimizer.load_state_dict(_join_optimizer(load_file(str(folder / "optimizer.safetensors")),
                                              scalars))


def delete(folder: Path) -> None:
    """The marker first, so a half-deleted folder is never read as a checkpoint."""
    (folder / MARKER).unlink()
    shutil.rmtree(folder)


def listing(root: Path, run: str) -> list[dict]:
    """Committed checkpoints of `run`, as the SDK's Checkpoint records, oldest first."""
    out = []
    base = run_folder(root, run)
    for kind, ctype in KINDS.items():
        for folder in sorted((base / kind).glob("*")) if (base / kind).is_dir() else []:
            if not (folder / MARKER).is_file():
                continue
            stamp = datetime.fromtimestamp((folder / MARKER).stat().st_mtime, UTC)
            out.append({"checkpoint_id": f"{kind}/{folder.name}", "checkpoint_type": ctype,
                        "time": stamp.isoformat(), "tinker_path": f"tinker://{run}/{kind}/"
                        f"{folder.name}", "size_bytes": sum(p.stat().st_size
                                                            for p in folder.iterdir())})
    return sorted(out, key=lambda c: c["time"])
