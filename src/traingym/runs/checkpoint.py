"""Atomic checkpoints that resume a run exactly.

`checkpoints/step_NNNNNN/` holds the model and optimizer (safetensors), scalars and loop state
(JSON; no pickles) and `manifest.json` with every file's sha256. It is written to a temporary
folder, fsynced, `COMMITTED` written last, then renamed into place; a folder without
`COMMITTED` or not matching its manifest is never loaded. `extra` modules (e.g. PPO's value
head) are saved beside the model, never inside model.safetensors, which serve, eval and
teachers load as the policy.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, load_model, save_file, save_model

MARKER = "COMMITTED"


class CheckpointError(RuntimeError):
    pass


def _fsync_file(path: Path) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _split_optimizer(state: dict) -> tuple[dict[str, torch.Tensor], dict]:
    tensors, scalars = {}, {"param_groups": state["param_groups"], "state": {}}
    for idx, slots in state["state"].items():
        for key, value in slots.items():
            if isinstance(value, torch.Tensor):
                tensors[f"{idx}.{key}"] = value.contiguous()
            else:
                scalars["state"].setdefault(str(idx), {})[key] = value
    return tensors, scalars


def _join_optimizer(tensors: dict[str, torch.Tensor], scalars: dict) -> dict:
    state: dict = {}
    for name, value in tensors.items():
        idx, key = name.split(".", 1)
        state.setdefault(int(idx), {})[key] = value
    for idx, slots in scalars["state"].items():
        state.setdefault(int(idx), {}).update(slots)
    return {"state": state, "param_groups": scalars["param_groups"]}


def save(root: Path, step: int, model, optimizer, loop_state: dict, keep: int,
         extra: dict | None = None) -> Path:
    """Write checkpoint `step` under root atomically; keep the newest `keep` ones."""
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step_{step:06d}"
    tmp = root / f".tmp_step_{step:06d}_{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    save_model(model, str(tmp / "model.safetensors"))
    for name, module in (extra or {}).items():
        save_model(module, str(tmp / f"{name}.safetensors"))
    opt_tensors, opt_scalars = _split_optimizer(optimizer.state_dict())
    save_file(opt_tensors, str(tmp / "optimizer.safetensors"))
    (tmp / "optimizer.json").write_text(json.dumps(opt_scalars))
    save_file({"torch": torch.get_rng_state()}, str(tmp / "rng.safetensors"))
    state = {"step": step, "python_rng": _py_rng_to_json(random.getstate()), **loop_state}
    (tmp / "state.json").write_text(json.dumps(state, indent=1))
    files = sorted(p.name for p in tmp.iterdir())
    for name in files:
        _fsync_file(tmp / name)
    manifest = {name: _sha256(tmp / name) for name in files}
    (tmp / "manifest.json").write_text(json.dumps(manifest, indent=1))
    _fsync_file(tmp / "manifest.json")
    (tmp / MARKER).write_text("ok\n")
    _fsync_file(tmp / MARKER)
    _fsync_dir(tmp)
    if final.exists():
        shutil.rmtree(final)
    tmp.rename(final)
    _fsync_dir(root)
    for old in committed(root)[:-keep]:
        shutil.rmtree(old)
    return final


def committed(root: Path) -> list[Path]:
    """Committed checkpoint folders, oldest first."""
    if not root.is_dir():
        return []
    return sorted(p for p in root.glob("step_*") if (p / MARKER).is_file())


def verify(folder: Path) -> dict:
    if not (folder / MARKER).is_file():
        raise CheckpointError(f"{folder} has no {MARKER} marker: it was never finished")
    manifest = json.loads((folder / "manifest.json").read_text())
    for name, digest in manifest.items():
        if _sha256(folder / name) != digest:
            raise CheckpointError(f"{folder / name} does not match its sha256 in the manifest")
    return manifest


def load(folder: Path, model, optimizer, extra: dict | None = None) -> dict:
    """Restore model, optimizer, `extra` modules and RNG states in place; return the loop
    state."""
    manifest = verify(folder)
    missing, unexpected = load_model(model, str(folder / "model.safetensors"))
    if missing or unexpected:
        raise CheckpointError(f"{folder}: model keys differ (missing {missing}, unexpected {unexpected})")
    load_extra(folder, manifest, extra or {})
    scalars = json.loads((folder / "optimizer.json").read_text())
    optimizer.load_state_dict(_join_optimizer(load_file(str(folder / "optimizer.safetensors")), scalars))
    torch.set_rng_state(load_file(str(folder / "rng.safetensors"))["torch"])
    state = json.loads((folder / "state.json").read_text())
    random.setstate(_py_rng_from_json(state["python_rng"]))
    return state


def extra_modules(trainer) -> dict:
    """What `trainer` trains beside its model (`extra_modules`; none when it has no such
    attribute, e.g. data-parallel trainers)."""
    return dict(getattr(trainer, "extra_modules", None) or {})


def load_extra(folder: Path, manifest: dict, extra: dict) -> None:
    held = {n.removesuffix(".safetensors") for n in manifest
            if n.endswith(".safetensors")} - {"model", "optimizer", "rng"}
    if held != set(extra):
        raise CheckpointError(
            f"{folder} holds modules {sorted(held)} beside the model, this run trains "
            f"{sorted(extra)}: resume with the algorithm that wrote it (a value head is "
            "saved by algorithm.name='ppo')")
    for name, module in extra.items():
        missing, unexpected = load_model(module, str(folder / f"{name}.safetensors"))
        if missing or unexpected:
            raise CheckpointError(f"{folder}: {name} keys differ (missing {missing}, "
                                  f"unexpected {unexpected})")


def _py_rng_to_json(state) -> list:
    version, internal, gauss = state
    return [version, list(internal), gauss]


def _py_rng_from_json(data) -> tuple:
    return (data[0], tuple(data[1]), data[2])
