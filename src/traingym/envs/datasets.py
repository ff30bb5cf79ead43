"""Datasets as lists of rows: from a Python list, a JSONL file, or a local `datasets` folder.

Rows are validated before any work starts: a row missing a required field is named.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable


class DatasetError(ValueError):
    """A dataset that cannot be used; names the file, row and field."""


def load_rows(source: str | Path | Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    if isinstance(source, (str, Path)):
        path = Path(source)
        if path.is_file() and path.suffix in (".jsonl", ".json"):
            rows = []
            for n, line in enumerate(path.read_text().splitlines(), 1):
                if not line.strip():
                    continue
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise DatasetError(f"{path}:{n}: not valid JSON ({e.msg})") from None
            return rows
        if path.is_dir():
            try:
                import datasets  # optional extra: pip install traingym[datasets]
            except ModuleNotFoundError:
                raise DatasetError(f"dataset {path}: a folder needs the `datasets` package "
                                   "(pip install 'traingym[datasets]'), or give a .jsonl "
                                   "file") from None
            try:
                ds = datasets.load_from_disk(str(path))
            except FileNotFoundError as e:  # a folder that save_to_disk did not write
                raise DatasetError(f"dataset {path}: not a `datasets` folder saved with "
                                   f"save_to_disk ({e})") from None
            if isinstance(ds, datasets.DatasetDict):
                if "train" not in ds:
                    raise DatasetError(f"{path}: a DatasetDict needs a 'train' split; has {list(ds)}")
                ds = ds["train"]
            return [dict(r) for r in ds]
        what = "does not exist" if not path.exists() else f"has the suffix {path.suffix!r}"
        raise DatasetError(f"dataset {path} {what}: expected a .jsonl file or a `datasets` "
                           "folder saved with save_to_disk")
    return [dict(r) for r in source]


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
