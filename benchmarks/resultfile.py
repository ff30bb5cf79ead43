"""Where every benchmark writes its figures: a NEW file per run, with what decides the figures.

    benchmarks/results/<benchmark>/<UTC date>-<short commit>[-<label>].json

A later run never replaces an earlier one: a name already taken gets `-2`, `-3`, ... The file
holds the script's figures at the top level plus `provenance`: the command line, git commit and
whether the tree had uncommitted changes, CPU model and flags (bf16 kernels or not), cores,
memory, package versions (torch, transformers, and vLLM from .venv-vllm when it exists),
thread settings, and the load average when the run started and when it ended.

    rec = resultfile.start("engine_throughput", args)   # args from resultfile.add_args(parser)
    ...
    path = rec.write(figures)

`--out FILE` writes somewhere else instead (smoke runs: /tmp/...); inside benchmarks/results it
still refuses to replace a file. Scripts run as `python benchmarks/<name>.py`, so this module is
imported as `resultfile` (the script's folder is first on sys.path).
"""

from __future__ import annotations

import datetime as dt
import glob
import json
import os
import platform
import re
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "VLLM_CPU_OMP_THREADS_BIND",
               "ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS")
CPU_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile", "avx512_vnni")


def add_args(parser) -> None:
    """`--label` (a suffix of the file name) and `--out` (another path, for smoke runs)."""
    parser.add_argument("--label", default=None,
                        help="suffix of the result file's name (letters, digits, '-', '_', '.')")
    parser.add_argument("--out", default=None,
                        help="write here instead of benchmarks/results/<benchmark>/ (smoke runs)")


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True,
                          check=False).stdout.strip()


def _loadavg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def _cpu() -> dict:
    model, flags = platform.processor(), set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                model = value.strip()
            elif key.strip() == "flags":
                flags = set(value.split())
                break
    except OSError:
        pass
    try:
        import torch

        from traingym.core.precision import fast_bf16
        bf16, capability = fast_bf16("cpu"), torch.backends.cpu.get_cpu_capability()
    except ImportError:
        bf16, capability = None, None
    return {"model": model, "flags": sorted(f for f in CPU_FLAGS if f in flags),
            "bf16_kernels": bf16, "torch_capability": capability,
            "cores": os.cpu_count(), "usable_cores": len(os.sched_getaffinity(0)),
            "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
                                / 2**30, 1)}


def _version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _vllm_version() -> str | None:
    """vLLM's version: in this environment, else in .venv-vllm (read from its metadata)."""
    found = _version("vllm") or _version("vllm-cpu")
    if found:
        return found
    for info in glob.glob(str(ROOT / ".venv-vllm/lib/python*/site-packages/vllm*.dist-info")):
        match = re.match(r"vllm(?:_cpu)?-([^-]+)\.dist-info$", Path(info).name)
        if match:
            return match.group(1)
    return None


def _threads() -> dict:
    out = {k: os.environ[k] for k in THREAD_VARS if k in os.environ}
    if "torch" in sys.modules:
        out["torch_threads"] = sys.modules["torch"].get_num_threads()
    return out


def head_state() -> tuple[str, bool]:
    """HEAD and whether tracked files differ from it (taken when a run starts: in a shared
    checkout a later commit may land while it runs)."""
    return git("rev-parse", "HEAD"), bool(git("status", "--porcelain", "--untracked-files=no"))


def provenance(started: float, load_before: list[float],
               commit: tuple[str, bool] | None = None) -> dict:
    """What decides a run's figures; `commit` as `head_state()` returned when the run started
    (default: now)."""
    commit = commit or head_state()
    return {
        "command": shlex.join([Path(sys.executable).name, *sys.argv]),
        "commit": commit[0], "dirty": commit[1],
        "started": dt.datetime.fromtimestamp(started, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "wall_s": round(time.time() - started, 2),
        "machine": _cpu(), "host": platform.node(), "python": platform.python_version(),
        "versions": {"torch": _version("torch"), "transformers": _version("transformers"),
                     "vllm": _vllm_version(), "traingym": _version("traingym")},
        "threads": _threads(),
        "load_before": load_before, "load_after": _loadavg(),
    }


def new_path(benchmark: str, label: str | None = None, when: float | None = None,
             commit: str | None = None) -> Path:
    """The first free `<benchmark>/<date>-<commit>[-<label>][-N].json` under benchmarks/results."""
    if label is not None and not re.fullmatch(r"[A-Za-z0-9_.-]+", label):
        raise SystemExit(f"--label {label!r}: use letters, digits, '-', '_' and '.' only")
    date = dt.datetime.fromtimestamp(when or time.time(), dt.UTC).strftime("%Y-%m-%d")
    stem = f"{date}-{(commit or git('rev-parse', 'HEAD') or 'nogit')[:7]}"
    stem += f"-{label}" if label else ""
    folder = RESULTS / benchmark
    path, n = folder / f"{stem}.json", 2
    while path.exists():
        path, n = folder / f"{stem}-{n}.json", n + 1
    return path


@dataclass
class Recorder:
    benchmark: str
    label: str | None = None
    out: str | None = None
    started: float = field(default_factory=time.time)
    load_before: list[float] = field(default_factory=_loadavg)
    commit: tuple[str, bool] = field(default_factory=head_state)

    def write(self, figures: dict) -> Path:
        """Write `figures` plus `provenance` to a new file; return its path."""
        if "provenance" in figures:
            raise ValueError("'provenance' is the result file's own key; rename the figure")
        if self.out:
            path = Path(self.out).resolve()
            if path.exists() and RESULTS in path.parents:
                raise SystemExit(f"{path} exists: result files are never replaced; drop --out "
                                 "to get a new name")
        else:
            path = new_path(self.benchmark, self.label, self.started, self.commit[0])
        path.parent.mkdir(parents=True, exist_ok=True)
        record = {**figures, "provenance": provenance(self.started, self.load_before,
                                                      self.commit)}
        text = json.dumps(record, indent=2, default=str) + "\n"
        while True:
            try:
                with open(path, "x" if RESULTS in path.parents else "w") as f:
                    f.write(text)
                break
            except FileExistsError:  # another run took the name since new_path looked
                path = new_path(self.benchmark, self.label, self.started, self.commit[0])
        print(f"wrote {path.relative_to(ROOT) if ROOT in path.parents else path}")
        return path


def start(benchmark: str, args=None) -> Recorder:
    """Begin a run of `benchmark` (the load average is taken now); `args` from add_args."""
    return Recorder(benchmark, getattr(args, "label", None), getattr(args, "out", None))
