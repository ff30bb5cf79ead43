"""Sandbox images (sandbox/images.py): the sandbox's only Python is its image, never the host's
site-packages (issue 16 acceptance 1), and a code task whose tests need numpy runs in an image
that provides it, built once and reused, from the warm pool (acceptance 2).

Acceptance 1 installs traingym (not editable) and a host package into a fresh interpreter
prefix P (the base installation's standard library, hard-linked, with a site-packages of its
own) and runs the sandbox backend from P's interpreter in a subprocess, so P is the prefix that
bwrap binds. The process backend (not a boundary) is the control: there the hack works.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from prereq import require_sandbox

from tests.sandbox.conftest import SMALL
from traingym.envs.code_env import GRADING_LIMITS, CodeEnvMaker, pool_for
from traingym.envs.code_grader import grade
from traingym.envs.resources import RunResources
from traingym.sandbox import open_sandbox
from traingym.sandbox.images import (
    ImageBuildError,
    ImageSpec,
    ImageSpecError,
    get_image,
    interpreter,
)
from traingym.sandbox.pool import SandboxPool
from traingym.core.types import Completion

REPO = Path(__file__).resolve().parents[2]
NUMPY = ImageSpec(requirements=("numpy",))
MEAN_ROW = {"entry": "mean_of", "inputs": [[[1, 2, 3]], [[4.0, 5.0]], [[-1, 1, 3, 5]]],
            "expected": [2.0, 4.5, 2.0]}
MEAN_SOLUTION = "import numpy as np\ndef mean_of(xs):\n    return float(np.mean(xs))\n"


@pytest.fixture(scope="session")
def image_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("images")


@pytest.fixture(scope="session")
def numpy_image(image_cache):
    """The numpy image, built once per test session (pip installs numpy from the package
    index; a few seconds from this machine's wheel cache)."""
    require_sandbox("bwrap", SMALL)
    image = get_image(NUMPY, cache=image_cache)
    assert image.build_s is not None and any(p.startswith("numpy==") for p in image.installed)
    return image


def run_in(image, code: str, backend: str = "bwrap"):
    async def main():
        sandbox = await open_sandbox(backend, SMALL, image=image)
        try:
            return await sandbox.exec(code)
        finally:
            await sandbox.close()

    return asyncio.run(main())


def test_default_image_sees_no_host_package():
    require_sandbox("bwrap", SMALL)
    interp = interpreter(sys.executable)
    r = run_in(None, """
import json, os, sys
found = {}
for name in ("numpy", "traingym", "pytest", "pydantic"):
    try:
        __import__(name)
        found[name] = True
    except ImportError:
        found[name] = False
print(json.dumps({"path": sys.path, "found": found, "version": sys.version,
      "flags": [sys.flags.isolated,
      sys.flags.no_user_site], "env": sorted(os.environ),
      "listings": {d: os.listdir(d) for d in sys.argv[1:] if os.path.isdir(d)},
      "writable": [d for d in sys.argv[1:] if os.access(d, os.W_OK)]}))
""".replace("sys.argv[1:]", repr(interp.masked_dirs())))
    assert r.ok, r
    out = json.loads(r.stdout)
    assert not any(out["found"].values()), out["found"]
    stdlib = interp.stdlib
    allowed = {"", stdlib, f"{interp.prefix}/lib/python{interp.version.replace('.', '')}.zip",
               f"{stdlib}/lib-dynload", *interp.site_dirs}
    assert set(out["path"]) <= allowed, out["path"]
    assert out["flags"] == [1, 1]
    assert out["version"] == interp.full_version  # its own libpython, not another Python's
    assert "PYTHONPATH" not in out["env"] and "PYTHONNOUSERSITE" in out["env"]
    assert out["listings"] and all(v == [] for v in out["listings"].values()), out["listings"]
    assert out["writable"] == []  # read-only: nothing planted there outlives a pool session


def test_argv_python_sees_no_host_package_either():
    """`python3` run as a command (no -I) and a hand-added sys.path entry find nothing."""
    require_sandbox("bwrap", SMALL)
    site = interpreter(sys.executable).site_dirs[0]

    async def main():
        sandbox = await open_sandbox("bwrap", SMALL)
        try:
            return await sandbox.exec(["python3", "-c", f"import sys; sys.path.append({site!r}); "
                                       "import numpy"])
        finally:
            await sandbox.close()

    r = asyncio.run(main())
    assert r.exit_code == 1 and b"No module named 'numpy'" in r.stderr, r


def make_prefix(root: Path) -> Path:
    """A fresh interpreter prefix: the base installation's bin and standard library hard-linked
    (no site-packages), with traingym (a plain, non-editable install) and idna installed by pip
    into its own site-packages."""
    interp = interpreter(sys.executable)
    base, prefix = Path(interp.prefix), root / "prefix"
    ver = f"python{interp.version}"
    (prefix / "bin").mkdir(parents=True)
    os.link(interp.python, prefix / "bin" / ver)
    skip = shutil.ignore_patterns("site-packages", "test", "idlelib", "tkinter", "turtledemo")
    shutil.copytree(base / "lib" / ver, prefix / "lib" / ver, ignore=skip, copy_function=os.link)
    site = prefix / "lib" / ver / "site-packages"
    src = root / "traingym-src"  # the sources only: setuptools writes build/ next to them
    shutil.copytree(REPO / "src", src / "src", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src / name)
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps",
                    "--no-build-isolation", "--target", str(site), str(src), "idna"],
                   check=True, capture_output=True)
    return prefix


PREFIX_SCRIPT = r"""
import asyncio, json, sys
import traingym
from traingym.envs.code_grader import grade
from traingym.envs.resources import RunResources
from traingym.envs.code_problems import code_rows
from traingym.sandbox import Limits, open_sandbox

prefix, cache = sys.argv[1], sys.argv[2]
assert sys.base_prefix == prefix and traingym.__file__.startswith(prefix), traingym.__file__
row = next(r for r in code_rows() if r["entry"] == "add")
HACK = ("def add(a, b):\n"
        "    from traingym.envs.code_problems import PROBLEMS_BY_NAME\n"
        "    return PROBLEMS_BY_NAME['add'].reference(a, b)\n")
PROBE = ("import importlib.util as u, json, sys\n"
         "found = {n: u.find_spec(n) is not None for n in ('traingym', 'idna', 'six')}\n"
         "print(json.dumps(found) if sys.version == %r else 'another Python: ' + sys.version)"
         % sys.version)
FIND = ("import os\nhits = []\nfor d, _, files in os.walk(%r):\n"
        "    hits += [os.path.join(d, f) for f in files if f.startswith('code_problems')]\n"
        "print(len(hits))" % prefix)  # the hidden tests' module, on disk in the prefix
limits = Limits(cpu_s=5, wall_s=20, memory_bytes=512 << 20, processes=32)

async def case(backend, image):
    sandbox = await open_sandbox(backend, limits, image=image)
    try:
        probe, find = await sandbox.exec(PROBE), await sandbox.exec(FIND)
        assert probe.ok and find.ok, (probe, find)
        verdict = await grade(sandbox, HACK, "add", row["inputs"], row["expected"])
        return {"imports": json.loads(probe.stdout), "found_files": int(find.stdout),
                "reward": verdict.reward,
                "details": verdict.details[:1]}
    finally:
        await sandbox.close()

async def main():
    six = {"requirements": ["six"]}
    from traingym.sandbox.images import get_image
    return {"process": await case("process", None), "bwrap": await case("bwrap", None),
            "bwrap_six": await case("bwrap", get_image(six, cache=cache))}

print("RESULT " + json.dumps(asyncio.run(main())))
"""


@pytest.fixture
def var_tmp():
    """A folder outside /tmp (the sandbox's /tmp is its own scratch tmpfs)."""
    path = Path(tempfile.mkdtemp(prefix="traingym-prefix-", dir="/var/tmp"))
    yield path
    shutil.rmtree(path)


def test_traingym_in_the_base_prefix_is_invisible_and_the_hidden_test_hack_earns_0(tmp_path,
                                                                                   var_tmp):
    """Acceptance 1."""
    require_sandbox("bwrap", SMALL)
    prefix = make_prefix(var_tmp)
    venv_site = Path(sys.prefix, "lib", f"python{sys.version_info[0]}.{sys.version_info[1]}",
                     "site-packages")  # traingym's host-side deps; its editable .pth is not read
    env = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/root"),
           "PYTHONPATH": str(venv_site)}
    out = subprocess.run([str(prefix / "bin" / f"python{sys.version_info[0]}."
                              f"{sys.version_info[1]}"), "-c", PREFIX_SCRIPT, str(prefix),
                          str(tmp_path / "images")],
                         capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.split("RESULT ", 1)[1])
    # the control: outside a boundary, traingym is importable and the hack takes every case
    assert result["process"]["imports"] == {"traingym": True, "idna": True, "six": False}
    assert result["process"]["reward"] == 1.0 and result["process"]["found_files"] >= 1
    # bwrap from the same interpreter: neither traingym nor idna, and the hack earns 0
    assert result["bwrap"]["imports"] == {"traingym": False, "idna": False, "six": False}
    assert result["bwrap"]["reward"] == 0.0 and result["bwrap"]["found_files"] == 0
    assert "No module named 'traingym'" in result["bwrap"]["details"][0]
    # an image that names six: six imports, the host's packages still do not
    assert result["bwrap_six"]["imports"] == {"traingym": False, "idna": False, "six": True}
    assert result["bwrap_six"]["reward"] == 0.0


def test_numpy_task_runs_in_the_numpy_image_built_once_from_the_warm_pool(numpy_image,
                                                                          image_cache, capsys):
    """Acceptance 2: the task fails without the image, passes with it; the image is reused (no
    second build) and served by the warm pool."""
    t0 = time.monotonic()
    again = get_image(NUMPY, cache=image_cache)
    memo_s = time.monotonic() - t0
    assert again.path == numpy_image.path and again.build_s is None
    from traingym.sandbox import images

    images._memo.clear()  # as a new process would: hash the spec, find the folder
    t0 = time.monotonic()
    fresh = get_image(NUMPY, cache=image_cache)
    lookup_s = time.monotonic() - t0
    assert fresh.path == numpy_image.path and fresh.build_s is None

    async def main():
        t0 = time.monotonic()
        bare = await open_sandbox("bwrap", SMALL)
        try:
            verdict = await grade(bare, MEAN_SOLUTION, **MEAN_ROW)
        finally:
            await bare.close()
        assert verdict.reward == 0.0 and "numpy" in verdict.details[0], verdict.details
        pool = SandboxPool(lambda: open_sandbox("bwrap", SMALL, image=fresh), min_ready=1,
                           max_size=2)
        t0 = time.monotonic()
        await pool.warm(1)
        start_s = time.monotonic() - t0
        try:
            verdicts = [await grade_in(pool) for _ in range(4)]
        finally:
            await pool.close()
        return start_s, verdicts, pool.stats()

    async def grade_in(pool):
        async with pool.session() as sandbox:
            return await grade(sandbox, MEAN_SOLUTION, **MEAN_ROW)

    start_s, verdicts, stats = asyncio.run(main())
    assert [v.reward for v in verdicts] == [1.0] * 4, [v.details for v in verdicts]
    assert stats["acquired"] == 4 and stats["started"] <= 2 and stats["reset"] >= 3, stats
    with capsys.disabled():
        print(f"\nnumpy image: build {numpy_image.build_s:.2f} s; second start: lookup "
              f"{lookup_s * 1e3:.1f} ms (in-process memo {memo_s * 1e6:.0f} us), sandbox start "
              f"{start_s * 1e3:.0f} ms; pool {stats['acquired']} sessions from "
              f"{stats['started']} sandbox(es)")


class TextTokenizer:
    def decode(self, ids, skip_special_tokens=True):
        return MEAN_SOLUTION


def test_code_env_with_a_numpy_image_grades_through_the_run_pool(numpy_image, image_cache,
                                                                 monkeypatch):
    """The env path: CodeEnvMaker(image=...) -> CodeEnv.step -> the run's pool for that image."""
    monkeypatch.setenv("TRAINGYM_IMAGE_CACHE", str(image_cache))  # the session's built image
    renderer = SimpleNamespace(tokenizer=TextTokenizer())
    row = {"prompt": "mean", **MEAN_ROW}
    completion = Completion((1,), (2,), (-0.1,), "stop", 0)

    async def main():
        async with RunResources():
            with_numpy = await CodeEnvMaker(image={"requirements": ["numpy"]})(
                row, renderer).step(completion)
            stdlib = await CodeEnvMaker()(row, renderer).step(completion)
            return with_numpy, stdlib

    with_numpy, stdlib = asyncio.run(main())
    assert with_numpy.reward == 1.0 and with_numpy.info["status"] == "pass", with_numpy.info
    assert stdlib.reward == 0.0 and stdlib.info["status"] == "load_error", stdlib.info


def test_pools_are_keyed_by_image_and_the_spec_is_checked():
    assert CodeEnvMaker(image={"requirements": ["numpy"]}).image == NUMPY
    assert CodeEnvMaker().image == ImageSpec() and ImageSpec().empty

    async def pools():  # made lazily: no sandbox starts here
        async with RunResources():
            return [pool_for("bwrap", GRADING_LIMITS, image) for image in
                    (None, {}, NUMPY, {"requirements": ["numpy"]})]

    bare, bare_again, numpy_pool, numpy_again = asyncio.run(pools())
    assert bare is bare_again and numpy_pool is numpy_again and bare is not numpy_pool
    bad = [({"requirement": ["numpy"]}, "unknown image keys"),
           ({"requirements": "numpy"}, "must be a list"),
           ({"requirements": ["numpy>>2"]}, "not a valid requirement"),
           ({"requirements": ["-e ."]}, "installer option"),
           ({"files": "/nonexistent/folder"}, "is not a folder"),
           ({"lock": "/nonexistent/lock.txt"}, "does not exist"),
           ({"python": "3.99"}, "no python3.99"),
           ({"python": "2.7"}, "a version like"),
           ("numpy", "a mapping")]
    for spec, message in bad:
        with pytest.raises(ImageSpecError, match=message):
            CodeEnvMaker(image=spec)


def test_a_failed_build_names_the_requirement_and_leaves_nothing(tmp_path):
    spec = ImageSpec(requirements=("six", "traingym-no-such-package-zz==9.9"))
    lines = []
    with pytest.raises(ImageBuildError) as err:
        get_image(spec, cache=tmp_path, progress=lines.append)
    message = str(err.value)
    assert "requirement traingym-no-such-package-zz==9.9 failed" in message, message
    assert "ERROR" in message and "six" not in message.split("failed")[0]
    assert any("building" in ln for ln in lines)  # progress was shown
    assert [p.name for p in tmp_path.iterdir() if not p.name.endswith(".lock")] == []


def test_files_are_read_only_and_concurrent_builders_build_once(tmp_path):
    require_sandbox("bwrap", SMALL)
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "data.txt").write_text("checkout")
    spec = ImageSpec(files=str(repo))
    cache = tmp_path / "cache"
    from traingym.sandbox import images

    results, errors = [], []

    def build():
        try:
            results.append(images._build_locked(spec, interpreter(sys.executable), cache,
                                                 lambda line: None))
        except Exception as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=build) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len({r.path for r in results}) == 1
    assert sum(r.build_s is not None for r in results) == 1  # the others waited and reused it
    assert sorted(p.name for p in cache.iterdir() if not p.name.endswith(".lock")) == [
        results[0].digest]
    r = run_in(results[0], "print(open('/image/files/data.txt').read())\n"
               "try:\n    open('/image/files/new.txt', 'w')\nexcept OSError as e:\n"
               "    print(type(e).__name__)")
    assert r.ok and r.stdout.split() == [b"checkout", b"OSError"], r


BUILD = """
import sys
from traingym.sandbox.images import get_image
image = get_image({"files": sys.argv[1]}, cache=sys.argv[2], progress=lambda line: None)
print("BUILT" if image.build_s is not None else "FOUND", image.path)
"""


def test_builders_in_two_processes_build_once(tmp_path):
    """Two processes asking for one new image at once: one builds, the other finds it (waiting
    on the lock file when their builds overlap; the threads test above forces the overlap)."""
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "a.txt").write_text("a")
    cache = tmp_path / "cache"
    procs = [subprocess.Popen([sys.executable, "-c", BUILD, str(repo), str(cache)],
                              stdout=subprocess.PIPE, text=True) for _ in range(2)]
    outs = sorted(p.communicate(timeout=120)[0].split()[0] for p in procs)
    assert [p.returncode for p in procs] == [0, 0]
    assert outs == ["BUILT", "FOUND"], outs
    assert len([p for p in cache.iterdir() if not p.name.endswith(".lock")]) == 1
