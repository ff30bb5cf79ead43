"""Every figure README.md, BENCHMARKS.md and docs/ quote with a source agrees with its result file,
no ratio or ± error is quoted without a source, and the checker itself catches a changed number,
a changed result file, a missing file and a missing key (tests/claims.py has the format)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from claims import agrees, bare_figures, claims, problems

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", ROOT / "BENCHMARKS.md", *sorted((ROOT / "docs").rglob("*.md"))]


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_sourced_figures_agree_with_their_result_files(doc):
    assert problems(doc, ROOT) == []


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_ratio_or_error_is_quoted_without_a_source(doc):
    assert bare_figures(doc) == []


def test_the_front_door_and_the_benchmarks_quote_sourced_figures():
    assert len(claims(ROOT / "README.md", ROOT)) >= 3
    assert len(claims(ROOT / "BENCHMARKS.md", ROOT)) >= 40


@pytest.mark.parametrize("printed,value,ok", [
    ("+0.572", 0.5724, True), ("+0.572", 0.5726, False), ("0.572", -0.572, False),
    ("-0.07", -0.0712, True), ("25,501", 25501, True), ("25,501", 25502, False),
    ("3.3e-7", 3.26e-7, True), ("3.3e-7", 3.36e-7, False), ("194", 193.6, True),
    ("194", 193.4, False), ("\u22120.5", -0.5, True),
])
def test_a_figure_agrees_at_its_printed_precision(printed, value, ok):
    assert agrees(printed, value) is ok


def _tree(tmp_path: Path, line: str, data: dict) -> Path:
    (tmp_path / "benchmarks/results/x").mkdir(parents=True)
    (tmp_path / "benchmarks/results/x/r.json").write_text(json.dumps(data))
    doc = tmp_path / "doc.md"
    doc.write_text(f"# t\n\n{line}\n")
    return doc


F = "benchmarks/results/x/r.json"


def test_the_checker_catches_each_kind_of_drift(tmp_path):
    data = {"a": {"b": [0.5724, 2.0]}, "t": {"trl": 31.4, "ours": 17.59}, "h f": {"x/y": 3}}
    good = (f"gain +0.572<!-- src: {F}#/a/b/0 -->, speed 1.79x<!-- src: {F}#/t/trl / {F}#/t/ours"
            f" -->, 21-37x<!-- src: {F}#/a/b/1 * 18.5 -->")
    doc = _tree(tmp_path, good, data)
    assert problems(doc, tmp_path) == []
    assert [c.printed for c in claims(doc, tmp_path)] == ["+0.572", "1.79", "37"]
    doc.write_text(f"a key with a space and a slash: 3<!-- src: {F}#/h%20f/x~1y -->")
    assert problems(doc, tmp_path) == []

    doc.write_text(good.replace("+0.572", "+0.573"))  # a quoted number edited
    assert "printed +0.573" in " ".join(problems(doc, tmp_path))
    doc.write_text(good.replace("/a/b/0", "/a/c/0"))  # a key that is not there
    assert "no key 'c'" in " ".join(problems(doc, tmp_path))
    doc.write_text(good.replace("x/r.json#/a", "x/gone.json#/a"))  # a file that is not there
    assert "no such result file" in " ".join(problems(doc, tmp_path))
    doc.write_text(good)
    data["t"]["ours"] = 17.0  # the result file changed under the quote
    (tmp_path / F).write_text(json.dumps(data))
    assert "printed 1.79" in " ".join(problems(doc, tmp_path))
    doc.write_text(f"nothing here<!-- src: {F}#/a/b/0 -->")
    assert "no number" in " ".join(problems(doc, tmp_path))


def test_the_checker_fails_on_this_repo_when_a_quoted_figure_changes(tmp_path):
    """The same check as above, on a real claim of README.md in a copy of the repo's files."""
    readme = (ROOT / "README.md").read_text()
    first = claims(ROOT / "README.md", ROOT)[0]
    line = readme.splitlines()[first.line - 1]
    edited = first.printed[:-1] + str((int(first.printed[-1]) + 3) % 10)
    for path in {token.split("#")[0] for token in first.source.split() if "#" in token}:
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / path, tmp_path / path)
    doc = tmp_path / "README.md"
    doc.write_text(line)
    assert problems(doc, tmp_path) == []
    doc.write_text(line.replace(first.printed + "<!--", edited + "<!--", 1))
    assert problems(doc, tmp_path), f"changing {first.printed} to {edited} went unnoticed"


def test_bare_figures_are_found_outside_code_only(tmp_path):
    doc = tmp_path / "d.md"
    doc.write_text("speed 1.8x here\n```\nrun 2x\n```\n    indented 3x\n`4x` in code\n"
                   f"sourced 1.8x<!-- src: {F}#/a -->\n"
                   f"0.5 ± 0.1<!-- src: {F}#/b --> and 2.0x<!-- src: {F}#/c -->\n"
                   f"first 1.5x then 2.5x<!-- src: {F}#/d -->\n"
                   f"open 1.5x<!-- src: {F}#/e\n"
                   f"3.1x<!-- src: {F}#/f --> against the 2x target (>= 1.5x, target 4x)\n")
    assert bare_figures(doc) == [
        "d.md:1: speed 1.8x here", f"d.md:9: first 1.5x then 2.5x<!-- src: {F}#/d -->",
        "d.md:10: a source comment that does not close on its line"]
