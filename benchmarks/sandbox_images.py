"""Sandbox images: build once, start again from the cache, and run from the warm pool.

    python benchmarks/sandbox_images.py [--requirement numpy] [--n 20]
        # -> benchmarks/results/sandbox_images/<date>-<commit>.json (benchmarks/resultfile.py)

In one run, with a fresh cache folder (so the first call really builds):
  - build_s: the first `get_image` (venv + installer; the installer's output is shown);
  - second start: a new process's `get_image` of the same spec (hash the spec, find the folder:
    `lookup_s`, measured in a subprocess so no in-process memo helps) and the cold start of a
    bwrap sandbox with the image vs with the default (stdlib-only) image, n each, side by side;
  - warm: `SandboxPool.exec` of a snippet that imports the package, p50 over n executions
    (each in a fresh, reset session; the import is paid per execution).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import resultfile

from traingym.sandbox import Limits, open_sandbox
from traingym.sandbox.images import ImageSpec, get_image, remove_image
from traingym.sandbox.pool import SandboxPool

LIMITS = Limits(cpu_s=10, wall_s=30, memory_bytes=1 << 30, processes=32)
LOOKUP = """
import sys, time
from traingym.sandbox.images import get_image
t0 = time.monotonic()
image = get_image({"requirements": [sys.argv[1]]}, cache=sys.argv[2])
assert image.build_s is None, "rebuilt"
print(time.monotonic() - t0)
"""


async def cold_starts(image, n: int) -> list[float]:
    times = []
    for _ in range(n):
        t0 = time.monotonic()
        sandbox = await open_sandbox("bwrap", LIMITS, image=image)
        times.append(time.monotonic() - t0)
        await sandbox.close()
    return times


async def warm_execs(image, snippet: str, n: int) -> list[float]:
    pool = SandboxPool(lambda: open_sandbox("bwrap", LIMITS, image=image), min_ready=2,
                       max_size=2)
    await pool.warm(2)
    times = []
    try:
        for _ in range(n):
            t0 = time.monotonic()
            result = await pool.exec(snippet)
            times.append(time.monotonic() - t0)
            assert result.ok, result
    finally:
        await pool.close()
    return times


def ms(xs: list[float]) -> dict:
    xs = sorted(xs)
    return {"p50_ms": round(statistics.median(xs) * 1e3, 1),
            "max_ms": round(xs[-1] * 1e3, 1), "n": len(xs)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requirement", default="numpy")
    ap.add_argument("--n", type=int, default=20)
    resultfile.add_args(ap)
    args = ap.parse_args()
    rec = resultfile.start("sandbox_images", args)
    cache = tempfile.mkdtemp(prefix="traingym-images-bench-", dir="/var/tmp")
    spec = ImageSpec(requirements=(args.requirement,))
    t0 = time.monotonic()
    image = get_image(spec, cache=cache)
    build_s = time.monotonic() - t0
    lookups = [float(subprocess.run([sys.executable, "-c", LOOKUP, args.requirement, cache],
                                    capture_output=True, text=True, check=True).stdout)
               for _ in range(3)]
    module = args.requirement.split("=")[0].split(">")[0].split("<")[0]
    snippet = f"import {module}\nprint({module}.__name__)"
    cold_image = asyncio.run(cold_starts(image, args.n))
    cold_default = asyncio.run(cold_starts(None, args.n))
    warm = asyncio.run(warm_execs(image, snippet, args.n))
    result = {
        "requirement": args.requirement,
        "installed": list(image.installed),
        "build_s": round(build_s, 2),
        "second_start_lookup_ms": round(statistics.median(lookups) * 1e3, 1),
        "cold_start_with_image": ms(cold_image),
        "cold_start_default_image": ms(cold_default),
        "warm_pool_exec_import": ms(warm),
        "python": platform.python_version(),
    }
    remove_image(image)  # read-only on disk
    shutil.rmtree(cache)  # what is left: the lock file
    print(json.dumps(result, indent=1))
    rec.write(result)


if __name__ == "__main__":
    main()
