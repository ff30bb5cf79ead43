"""Datasets as lists of rows: from a Python list, a JSONL file, a local `datasets` folder
(saved with `save_to_disk`: a Dataset, or a DatasetDict whose split is chosen), or a Hugging
Face hub dataset named 'hf:owner/name' (needs the hub; offline, the error says how to save it
to a folder elsewhere and give that).

Column mapping (task.columns): {field: column} renames a dataset's columns to the fields
traingym reads: 'prompt' (text), 'messages' (a list of chat messages used as the prompt; a
trailing assistant message is taken off and becomes 'answer' unless 'answer' is mapped) and
'answer'. Other columns are kept as they are.

Rows are validated before any work starts: a row missing a required field is named.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Iterable

HUB = "hf:"


class DatasetError(ValueError):
    """A dataset that cannot be used; names the file, row and field."""


def load_rows(source: str | Path | Iterable[dict[str, Any]], columns: dict[str, str] | None = None,
              split: str | None = None) -> list[dict[str, Any]]:
    """The rows of `source`, with `columns` mapped; `split` picks a DatasetDict's split."""
    if isinstance(source, (str, Path)) and str(source).startswith(HUB):
        rows = _hub_rows(str(source)[len(HUB):], split)
    elif isinstance(source, (str, Path)) and str(source).startswith("harbor:"):
        from traingym.envs.harbor import task_rows  # heavy: pydantic

        rows = task_rows(str(source)[len("harbor:"):])
    elif isinstance(source, (str, Path)):
        path = Path(source)
        if path.is_file() and path.suffix in (".jsonl", ".json"):
            if split is not None:
                raise DatasetError(f"dataset {path}: split {split!r} given, but a JSONL file has "
                                   "no splits; give each split its own file (task.eval_dataset) "
                                   "or unset task.split / task.eval_split")
            rows = _jsonl_rows(path)
        elif path.is_dir():
            rows = _folder_rows(path, split)
        else:
            what = "does not exist" if not path.exists() else f"has the suffix {path.suffix!r}"
            raise DatasetError(f"dataset {path} {what}: expected a .jsonl file, a `datasets` "
                               f"folder saved with save_to_disk, or a hub dataset as "
                               f"'{HUB}owner/name'")
    else:
        rows = [dict(r) for r in source]
    return map_columns(rows, columns or {}, str(source) if isinstance(source, (str, Path))
                       else "dataset")


def _jsonl_rows(path: Path) -> list[dict[str, Any]]:
    rows = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as e:
            raise DatasetError(f"{path}:{n}: not valid JSON ({e.msg})") from None
    return rows


def _datasets_module(what: str):
    try:
        import datasets  # optional extra: pip install traingym[datasets]
    except ModuleNotFoundError:
        raise DatasetError(f"dataset {what}: needs the `datasets` package (pip install "
                           "'traingym[datasets]'), or give a .jsonl file") from None
    return datasets


def _pick_split(ds, split: str | None, what: str):
    datasets = _datasets_module(what)
    if isinstance(ds, datasets.DatasetDict):
        name = split or "train"
        if name not in ds:
            raise DatasetError(f"dataset {what} has no split {name!r}; its splits are {list(ds)}: "
                               "set task.split (training) / task.eval_split (evaluation) to one")
        return ds[name]
    if split is not None:
        raise DatasetError(f"dataset {what} is a single Dataset with no splits, but split "
                           f"{split!r} was asked for: unset task.split / task.eval_split, or "
                           "save a DatasetDict")
    return ds


def _folder_rows(path: Path, split: str | None) -> list[dict[str, Any]]:
    datasets = _datasets_module(str(path))
    try:
        ds = datasets.load_from_disk(str(path))
    except FileNotFoundError as e:  # a folder that save_to_disk did not write
        raise DatasetError(f"dataset {path}: not a `datasets` folder saved with "
                           f"save_to_disk ({e})") from None
    return [dict(r) for r in _pick_split(ds, split, str(path))]


def _hub_rows(name: str, split: str | None) -> list[dict[str, Any]]:
    what = f"{HUB}{name}"
    if not name:
        raise DatasetError(f"dataset {what!r}: give the hub name after '{HUB}', e.g. "
                           f"'{HUB}openai/gsm8k'")
    datasets = _datasets_module(what)
    offline = os.environ.get("HF_HUB_OFFLINE", "").lower() in {"1", "true", "yes", "on"} or \
        os.environ.get("HF_DATASETS_OFFLINE", "").lower() in {"1", "true", "yes", "on"}
    try:
        ds = datasets.load_dataset(name)
    except Exception as e:  # no network, offline mode, unknown name: all named below
        why = ("the hub is switched off here (HF_HUB_OFFLINE / HF_DATASETS_OFFLINE is set)"
               if offline else "the hub could not be reached, or has no such dataset")
        raise DatasetError(
            f"dataset {what}: could not load it from the Hugging Face hub: {why} "
            f"({type(e).__name__}: {str(e)[:300]}). Fix: on a machine with network run "
            f"`datasets.load_dataset({name!r}).save_to_disk('FOLDER')`, copy FOLDER here and "
            "set task.dataset = 'FOLDER' (with task.split / task.columns as needed)") from e
    return [dict(r) for r in _pick_split(ds, split, what)]


def map_columns(rows: list[dict[str, Any]], columns: dict[str, str],
                name: str) -> list[dict[str, Any]]:
    """Rename dataset columns to traingym's fields (module docstring)."""
    if not columns:
        return rows
    out = []
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            raise DatasetError(f"{name} row {i}: expected an object, got {type(row).__name__}")
        missing = [c for c in columns.values() if c not in row]
        if missing:
            raise DatasetError(f"{name} row {i} has no column(s) {missing} named in "
                               f"task.columns; its columns are {sorted(row)}")
        new = {k: v for k, v in row.items() if k not in columns.values()}
        for field, col in columns.items():
            new["prompt" if field == "messages" else field] = row[col]
        if "messages" in columns:
            new["prompt"] = _messages(new["prompt"], f"{name} row {i} column "
                                      f"{columns['messages']!r}")
            if new["prompt"][-1]["role"] == "assistant" and len(new["prompt"]) > 1:
                last = new["prompt"].pop()
                if "answer" not in columns:
                    new["answer"] = last["content"]
        out.append(new)
    return out


def _messages(value: Any, where: str) -> list[dict[str, Any]]:
    if (not isinstance(value, list) or not value
            or not all(isinstance(m, dict) and "role" in m and "content" in m for m in value)):
        raise DatasetError(f"{where}: task.columns.messages needs a non-empty list of "
                           f"{{role, content}} messages, got {value!r:.200}; map a text column "
                           "as prompt instead")
    return [dict(m) for m in value]


def validate_rows(rows: list[dict[str, Any]], required: tuple[str, ...], name: str) -> None:
    if not rows:
        raise DatasetError(f"{name}: no rows")
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            raise DatasetError(f"{name} row {i}: expected an object, got {type(row).__name__}")
        missing = [f for f in required if f not in row]
        if missing:
            raise DatasetError(f"{name} row {i} is missing field(s) {missing}: {row!r}; every "
                               f"row needs {list(required)}")
