"""The restructure's behaviour-unchanged checks (issue 26), rerunnable: a tiny run's final
checkpoint hashes at this checkout and at `--before REV` (a git worktree of REV run with
PYTHONPATH on its src/, same venv), the size of src/ and its function-level traingym imports at
both, lint-imports at this checkout, and with `--default` the default run's held-out change
(`traingym train` with no config: several minutes on 2 cores).

    .venv/bin/python benchmarks/house_check.py --before 914a449 --default
        # -> benchmarks/results/house/<date>-<commit>.json
    .venv/bin/python benchmarks/house_check.py --out /tmp/house_check.json   # quick: tiny run only

Writes a NEW file through benchmarks/resultfile.py under the benchmark name `house` (the folder
these results have always been in, not the script's stem), with its provenance (the commit,
whether the tree had uncommitted changes, the machine and its load); `uncommitted_changes` is
whether src/ had any.
Not covered: the before side uses this venv's packages, not the ones REV pinned.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import resultfile

ROOT = Path(__file__).resolve().parents[1]
CKPT = ("model", "optimizer", "rng")


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True,
                          check=True).stdout.strip()


def _train(src: Path, run_dir: Path, *args: str) -> float:
    """`traingym train` from the package under `src`; returns its wall seconds."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PYTHONPATH"] = str(src)
    code = ("import sys; from traingym.cli import main; "
            "raise SystemExit(main(sys.argv[1:]))")
    t0 = time.monotonic()
    subprocess.run([sys.executable, "-c", code, "train", "--run-dir", str(run_dir), "--quiet",
                    *args], env=env, check=True, cwd=run_dir.parent, capture_output=True)
    return time.monotonic() - t0


def _hashes(run_dir: Path) -> dict[str, str]:
    last = sorted((run_dir / "checkpoints").glob("step_*"))[-1]
    return {k: hashlib.sha256((last / f"{k}.safetensors").read_bytes()).hexdigest()
            for k in CKPT}


def _size(src: Path) -> dict[str, int]:
    py = [p for p in (src / "traingym").rglob("*.py")]
    c = list((src / "traingym").rglob("*.c"))
    lines = {p: len(p.read_text().splitlines()) for p in py + c}
    return {"py_and_c_lines": sum(lines.values()),
            "py_lines": sum(n for p, n in lines.items() if p.suffix == ".py"),
            "files": len(lines), "function_level_traingym_imports": _function_imports(py)}


def _function_imports(files: list[Path]) -> int:
    """Import statements of traingym modules inside a function (each counted once)."""
    found = set()
    for p in files:
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for s in ast.walk(node):
                    if isinstance(s, ast.ImportFrom) and s.level == 0 and (
                            s.module or "").startswith("traingym"):
                        found.add((p, s.lineno))
                    elif isinstance(s, ast.Import) and any(
                            a.name.startswith("traingym") for a in s.names):
                        found.add((p, s.lineno))
    return len(found)


def _lint() -> dict:
    exe = Path(sys.executable).parent / "lint-imports"
    r = subprocess.run([str(exe), "--no-cache"], cwd=ROOT, capture_output=True, text=True)
    last = [ln for ln in r.stdout.splitlines() if ln.startswith("Contracts:")]
    return {"rc": r.returncode, "summary": last[-1] if last else r.stdout[-300:]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", help="the commit before the change (a git worktree of it)")
    ap.add_argument("--default", action="store_true", help="also the default run (minutes)")
    resultfile.add_args(ap)
    args = ap.parse_args()
    rec = resultfile.start("house", args)
    record: dict = {
        "uncommitted_changes": bool(_git("status", "--porcelain", "--", "src")),
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "after": {"size": _size(ROOT / "src"), "lint_imports": _lint()},
    }
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        record["after"]["tiny_seconds"] = _train(ROOT / "src", tmp / "tiny-after",
                                                 "--preset", "tiny")
        record["after"]["tiny_checkpoint_sha256"] = _hashes(tmp / "tiny-after")
        if args.before:
            wt = tmp / "before"
            _git("worktree", "add", "-q", "--detach", str(wt), args.before)
            try:
                record["before"] = {"commit": args.before, "size": _size(wt / "src")}
                record["before"]["tiny_seconds"] = _train(wt / "src", tmp / "tiny-before",
                                                          "--preset", "tiny")
                record["before"]["tiny_checkpoint_sha256"] = _hashes(tmp / "tiny-before")
            finally:
                _git("worktree", "remove", "--force", str(wt))
            record["tiny_checkpoints_equal"] = (record["before"]["tiny_checkpoint_sha256"]
                                                == record["after"]["tiny_checkpoint_sha256"])
        if args.default:
            run = tmp / "default"
            record["after"]["default_seconds"] = _train(ROOT / "src", run)
            results = json.loads((run / "results.json").read_text())
            record["after"]["default_eval"] = results["eval"]
    rec.write(record)
    if "tiny_checkpoints_equal" in record:
        print("tiny checkpoints equal before and after:", record["tiny_checkpoints_equal"])
    if args.default:
        d = record["after"]["default_eval"].get("delta", {})
        print({k: f"{v['delta']:+.3f} +- {v['se']:.3f}" for k, v in d.items()})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
