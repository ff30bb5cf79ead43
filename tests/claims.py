"""Figures quoted in the docs, checked against the result files they come from.

A quoted figure carries its source in an HTML comment right after it (invisible when rendered):

    held-out +0.572<!-- src: benchmarks/results/house/2026-12-04-bb875e0.json#/default/change -->

The source is a repo-relative result file, `#`, and a JSON pointer (RFC 6901: `/a/0/b`, `~1`
for a `/` in a key; in its URI-fragment form a space in a key is written `%20`). Several sources and numbers may be combined left to right with `+ - * /`
(no precedence), each token separated by spaces:

    1.79x<!-- src: F#/trl/s_per_step / F#/ours/s_per_step -->   85%<!-- src: F#/share * 100 -->

The figure is the last number before the comment on its line (after any earlier comment). It
must equal the source's value at the printed precision: `+0.572` matches 0.5724 but not 0.5726;
`25,501` matches 25501; `3.3e-7` matches 3.26e-7. A figure given as `-0.07` needs a negative
value; `21-37x` is the figure 37 (a `-` after a digit is a range, not a sign).

Also here: `bare_figures`, lines that quote a measured-looking figure (a ratio like `1.8x` or a
`±` error) outside code blocks without a source after it (a target, `target 2x` or `>= 2x`,
is a goal, not a figure).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote

COMMENT = re.compile(r"<!--\s*src:\s*(.*?)\s*-->")
NUMBER = re.compile(r"(?<![\d.,\w])([-+\u2212]?)(\d{1,3}(?:,\d{3})+|\d+)(\.\d+)?(?:[eE]([-+]?\d+))?")
RATIO_OR_ERROR = re.compile(r"(?<![\w.])\d+(?:\.\d+)?x\b|±")
# a goal, not a measurement: "target 1.5x", ">= 2x", "the 2x target"
TARGET = re.compile(r"target\s+\S*\d+(?:\.\d+)?x\b|[<>]=\s*\d+(?:\.\d+)?x\b|[≤≥]\s*\d|"
                    r"\d+(?:\.\d+)?x\s+target")


@dataclass
class Claim:
    file: str
    line: int
    printed: str
    source: str


def _pointer(data, pointer: str):
    if pointer in ("", "/"):
        return data
    if not pointer.startswith("/"):
        raise KeyError(f"pointer {pointer!r} must start with '/'")
    for raw in pointer[1:].split("/"):
        key = unquote(raw).replace("~1", "/").replace("~0", "~")
        if isinstance(data, list):
            data = data[int(key)]
        elif isinstance(data, dict):
            if key not in data:
                raise KeyError(f"no key {key!r} (keys: {sorted(data)[:12]})")
            data = data[key]
        else:
            raise KeyError(f"{key!r}: {type(data).__name__} has no keys")
    return data


def value_of(source: str, root: Path, cache: dict | None = None) -> float:
    """Evaluate a claim's source expression to a number (raises ValueError naming the problem)."""
    cache = {} if cache is None else cache
    tokens = source.split()
    if not tokens or len(tokens) % 2 == 0:
        raise ValueError(f"source {source!r}: want 'FILE#/pointer [op operand]...'")
    total = None
    for i in range(0, len(tokens), 2):
        token = tokens[i]
        if "#" in token:
            path, _, pointer = token.partition("#")
            if path not in cache:
                full = root / path
                if not full.is_file():
                    raise ValueError(f"{path}: no such result file")
                cache[path] = json.loads(full.read_text())
            try:
                operand = _pointer(cache[path], pointer)
            except (KeyError, IndexError, ValueError) as e:
                raise ValueError(f"{path}#{pointer}: {e}") from None
            if isinstance(operand, bool) or not isinstance(operand, (int, float)):
                raise ValueError(f"{path}#{pointer} is {operand!r}, not a number")
        else:
            operand = float(token)
        if total is None:
            total = float(operand)
            continue
        op = tokens[i - 1]
        if op not in "+-*/" or len(op) != 1:
            raise ValueError(f"source {source!r}: unknown operator {op!r}")
        total = {"+": total + operand, "-": total - operand, "*": total * operand,
                 "/": total / operand if operand else math.nan}[op]
    return total


def claims(path: Path, root: Path) -> list[Claim]:
    """Every sourced figure in one markdown file."""
    out = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        start = 0
        for match in COMMENT.finditer(line):
            before = COMMENT.sub(" ", line[start:match.start()])
            numbers = list(NUMBER.finditer(before))
            printed = numbers[-1].group(0) if numbers else ""
            out.append(Claim(str(path.relative_to(root)), n, printed, match.group(1)))
            start = match.end()
    return out


def agrees(printed: str, value: float) -> bool:
    """Whether `value` rounds to the figure as printed."""
    m = NUMBER.fullmatch(printed.strip())
    if not m:
        return False
    sign, whole, frac, exp = m.groups()
    shown = float(whole.replace(",", "") + (frac or "")) * (-1 if sign in "-\u2212" and sign else 1)
    scale = 10.0 ** int(exp or 0)
    half_ulp = 0.5 * 10.0 ** -(len(frac) - 1 if frac else 0) * scale
    return abs(value - shown * scale) <= half_ulp * (1 + 1e-9) + 1e-12


def problems(path: Path, root: Path, cache: dict | None = None) -> list[str]:
    """What is wrong with the sourced figures of one file (empty: all agree)."""
    found = []
    for c in claims(path, root):
        where = f"{c.file}:{c.line}"
        if not c.printed:
            found.append(f"{where}: a source comment with no number before it ({c.source})")
            continue
        try:
            value = value_of(c.source, root, cache)
        except ValueError as e:
            found.append(f"{where}: {c.printed}: {e}")
            continue
        if not agrees(c.printed, value):
            found.append(f"{where}: printed {c.printed}, but {c.source} is {value!r}")
    return found


def bare_figures(path: Path) -> list[str]:
    """Ratios (`1.8x`) and errors (`±`) outside code with no source comment after them on their
    line before the next such figure, and source comments that do not close on their line."""
    found, fenced = [], False
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if fenced or (line.startswith("    ") and not line.lstrip().startswith(("-", "*"))):
            continue
        if "<!-- src:" in line and line.count("<!-- src:") != len(COMMENT.findall(line)):
            found.append(f"{path.name}:{n}: a source comment that does not close on its line")
            continue
        text = re.sub(r"`[^`]*`", lambda m: " " * len(m.group()), line)
        text = COMMENT.sub(lambda m: "\0" * len(m.group()), text)  # comments: kept as markers
        figures = [m.start() for m in RATIO_OR_ERROR.finditer(text)
                   if not TARGET.search(text[max(0, m.start() - 12):m.end() + 8])]
        for i, at in enumerate(figures):
            end = figures[i + 1] if i + 1 < len(figures) else len(text)
            if "\0" not in text[at:end]:
                found.append(f"{path.name}:{n}: {line.strip()[:100]}")
                break
    return found
