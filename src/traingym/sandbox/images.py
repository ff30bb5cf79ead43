"""Sandbox images: the Python environment sandboxed code runs against, declared, not the host's.

An image is an interpreter, requirements and/or a pip lock file, and optional files, built once
by uv or pip into `TRAINGYM_IMAGE_CACHE/<sha256 of the spec>/` (venv/, files/, spec.json):
built in a temporary folder and renamed into place, one builder per digest (a lock file), then
made read-only. A failed build raises ImageBuildError naming the requirement. The sandbox
(sandbox/bwrap.py) mounts the image at /image as its only Python.
Limits: the cache key is the spec, not the resolution (pin versions for reproducible images);
venv/bin console scripts carry the build path (use `python -m tool`); files are read-only in
the sandbox; native libraries outside the venv and /usr (a conda prefix) are not reachable.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from glob import glob
from pathlib import Path

from traingym.sandbox.client import host_python

MOUNT = "/image"  # where an image's folder appears inside the sandbox
FORMAT = 1  # bump when the folder layout changes: old cache entries are then ignored
SPEC_KEYS = ("requirements", "lock", "files", "python")


class ImageSpecError(ValueError):
    """A bad image spec; the message names the field and the fix."""


class ImageBuildError(RuntimeError):
    """An image could not be built; the message names the failing requirement and pip's error."""


@dataclass(frozen=True)
class ImageSpec:
    """What an image holds. Frozen and hashable: pools are keyed by it."""

    requirements: tuple[str, ...] = ()  # pip requirement strings, e.g. "numpy>=2"
    lock: str | None = None  # a pip requirements file (pinned versions, hashes allowed)
    files: str | None = None  # a folder copied into the image (/image/files in the sandbox)
    python: str | None = None  # None: the host's; "3.12": a python3.12 found here; a path

    def __post_init__(self):
        reqs = self.requirements
        if isinstance(reqs, str) or not isinstance(reqs, (list, tuple)):
            raise ImageSpecError(f"image requirements must be a list of strings, got {reqs!r} "
                                 '(e.g. requirements=["numpy>=2"])')
        object.__setattr__(self, "requirements", tuple(reqs))
        for req in reqs:
            check_requirement(req)
        if self.lock is not None and not Path(self.lock).is_file():
            raise ImageSpecError(f"image lock file {self.lock!r} does not exist (give a pip "
                                 "requirements file, e.g. from `pip freeze` or `uv pip compile`)")
        if self.files is not None and not Path(self.files).is_dir():
            raise ImageSpecError(f"image files {self.files!r} is not a folder (give the folder "
                                 "to copy into the image, e.g. a repository checkout)")
        if self.python is not None:
            if not isinstance(self.python, str):
                raise ImageSpecError(f"image python must be a version like '3.12' or a path, "
                                     f"got {self.python!r}")
            find_python(self.python)

    @classmethod
    def parse(cls, value: ImageSpec | Mapping | None) -> ImageSpec:
        """An ImageSpec from a spec, a mapping with keys among SPEC_KEYS, or None (stdlib only)."""
        if value is None:
            return cls()
        if isinstance(value, cls):
            return value
        if not isinstance(value, Mapping):
            raise ImageSpecError(f"an image is a mapping with keys {SPEC_KEYS}, got {value!r}")
        unknown = sorted(set(value) - set(SPEC_KEYS))
        if unknown:
            raise ImageSpecError(f"unknown image keys {unknown}; an image has {SPEC_KEYS}")
        return cls(**value)

    @property
    def empty(self) -> bool:
        """Nothing to install or copy: the standard library only, no folder needed."""
        return not self.requirements and self.lock is None and self.files is None


def check_requirement(req) -> None:
    if not isinstance(req, str) or not req.strip():
        raise ImageSpecError(f"an image requirement must be a non-empty string, got {req!r}")
    if req.lstrip().startswith("-"):
        raise ImageSpecError(f"image requirement {req!r} is an installer option, not a "
                             "requirement; put options in a lock file or pip's config")
    from packaging.requirements import InvalidRequirement, Requirement

    try:
        Requirement(req)
    except InvalidRequirement as exc:
        raise ImageSpecError(f"image requirement {req!r} is not a valid requirement ({exc}); "
                             "write it as pip does, e.g. 'numpy>=2'") from exc


PROBE = r"""
import json, os, site, sys, sysconfig
v = sysconfig.get_config_vars()
lib = v.get("INSTSONAME") or v["LDLIBRARY"]  # the soname the executable loads (.so.1.0)
lib = os.path.join(v["LIBDIR"], lib) if v.get("Py_ENABLE_SHARED") else None
paths = sysconfig.get_paths()
print(json.dumps({
    "prefix": sys.base_prefix, "version": "%d.%d" % sys.version_info[:2],
    "full_version": sys.version, "stdlib": paths["stdlib"], "platstdlib": paths["platstdlib"],
    "site_dirs": site.getsitepackages([sys.base_prefix]) + [paths["purelib"], paths["platlib"]],
    "libpython": lib,
}))
"""
# Package folders of other interpreters on the host, masked too (a Debian python3's packages).
SYSTEM_SITE_GLOBS = ("/usr/lib/python3*/*-packages", "/usr/local/lib/python3*/*-packages",
                     "/usr/lib/python3/dist-packages")


@dataclass(frozen=True)
class Interpreter:
    python: str  # the base installation's executable (never a venv's)
    prefix: str
    version: str  # "3.11"
    full_version: str
    stdlib: str
    site_dirs: tuple[str, ...]  # its site-packages folders (masked in the sandbox)
    libpython: str | None  # its shared library, where the interpreter is built shared

    def masked_dirs(self) -> list[str]:
        """Every existing package folder of this interpreter and of the host's other Pythons."""
        found = [*self.site_dirs]
        for pattern in SYSTEM_SITE_GLOBS:
            found += glob(pattern)
        return sorted({os.path.realpath(d) for d in found if os.path.isdir(d)})


@functools.cache
def interpreter(python: str) -> Interpreter:
    """Probe the interpreter at `python` (its base installation, if it is a venv's)."""
    out = subprocess.run([python, "-I", "-S", "-c", PROBE], capture_output=True, text=True,
                         timeout=60)
    if out.returncode != 0:
        raise ImageSpecError(f"the interpreter {python} does not run: {out.stderr.strip()}")
    info = json.loads(out.stdout)
    base = Path(info["prefix"]) / "bin" / f"python{info['version']}"
    if not base.exists():
        raise ImageSpecError(f"no base interpreter at {base} (the installation of {python})")
    return Interpreter(str(base), info["prefix"], info["version"], info["full_version"],
                       info["stdlib"], tuple(info["site_dirs"]), info["libpython"])


def find_python(python: str | None) -> str:
    """The executable for an ImageSpec.python: None (the host's), a path, or a version."""
    if python is None:
        return host_python()
    if "/" in python:
        if not os.access(python, os.X_OK):
            raise ImageSpecError(f"image python {python!r} is not an executable")
        return python
    if not re.fullmatch(r"3\.\d+", python):
        raise ImageSpecError(f"image python {python!r}: give a version like '3.12' or a path")
    found = shutil.which(f"python{python}")
    pyenv = sorted(glob(os.path.expanduser(f"~/.pyenv/versions/{python}.*/bin/python{python}")))
    candidates = [found] if found else pyenv[-1:]
    if not candidates:
        raise ImageSpecError(f"no python{python} on this machine (PATH or ~/.pyenv): install "
                             f"it, or give image python as a path")
    return candidates[0]


@dataclass(frozen=True)
class Image:
    """A built (or empty) image, ready to mount."""

    spec: ImageSpec
    interpreter: Interpreter
    digest: str
    path: Path | None  # None: the empty image (stdlib only), nothing to mount
    build_s: float | None = None  # seconds this call spent building; None: found in the cache
    installed: tuple[str, ...] = field(default=())  # "name==version" of the venv's packages

    @property
    def python(self) -> str:
        """The interpreter's path inside the sandbox."""
        return f"{MOUNT}/venv/bin/python" if self.path else self.interpreter.python

    @property
    def host_python(self) -> str:
        """The interpreter's path on the host (for the process backend)."""
        return str(self.path / "venv/bin/python") if self.path else self.interpreter.python


def cache_root() -> Path:
    env = os.environ.get("TRAINGYM_IMAGE_CACHE")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return Path(xdg) / "traingym" / "images"


def _file_digest(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _tree_digest(root: Path) -> str:
    """sha256 over the folder's relative paths, modes, file contents and symlink targets."""
    h = hashlib.sha256()
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(filenames + [d for d in dirnames if os.path.islink(Path(dirpath, d))]):
            p = Path(dirpath, name)
            rel = str(p.relative_to(root))
            if p.is_symlink():
                h.update(f"L {rel} {os.readlink(p)}\n".encode())
            else:
                h.update(f"F {rel} {stat.S_IMODE(p.stat().st_mode):o} {_file_digest(p)}\n".encode())
    return h.hexdigest()


def spec_digest(spec: ImageSpec, interp: Interpreter) -> str:
    key = {
        "format": FORMAT,
        "python": [interp.python, interp.full_version],
        "requirements": list(spec.requirements),
        "lock": _file_digest(Path(spec.lock)) if spec.lock else None,
        "files": _tree_digest(Path(spec.files)) if spec.files else None,
    }
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()


def stderr_progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


_memo: dict[tuple, Image] = {}
_memo_lock = threading.Lock()


def get_image(spec: ImageSpec | Mapping | None = None, cache: str | Path | None = None,
              progress: Callable[[str], None] = stderr_progress) -> Image:
    """The image for `spec`, built into the cache if absent. Remembered per process, so a pool's
    later starts cost nothing (a changed files folder is seen by the next process)."""
    spec = ImageSpec.parse(spec)
    root = Path(cache) if cache is not None else cache_root()
    with _memo_lock:
        if (spec, root) in _memo:
            return _memo[(spec, root)]
    interp = interpreter(find_python(spec.python))
    if spec.empty:
        image = Image(spec, interp, "stdlib", None)
    else:
        image = _build_locked(spec, interp, root, progress)
    with _memo_lock:
        _memo[(spec, root)] = replace(image, build_s=None)  # later calls build nothing
    return image


def _build_locked(spec: ImageSpec, interp: Interpreter, root: Path,
                  progress: Callable[[str], None]) -> Image:
    digest = spec_digest(spec, interp)
    final = root / digest
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f"{digest}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a concurrent builder of this digest waits here
        if not final.is_dir():
            t0 = time.monotonic()
            _build(spec, interp, root, final, digest, progress)
            build_s = time.monotonic() - t0
            progress(f"image {digest[:12]}: built in {build_s:.1f} s at {final}")
        else:
            build_s = None
    meta = json.loads((final / "spec.json").read_text())
    return Image(spec, interp, digest, final, build_s, tuple(meta["installed"]))


def _build(spec: ImageSpec, interp: Interpreter, root: Path, final: Path, digest: str,
           progress: Callable[[str], None]) -> None:
    tmp = Path(tempfile.mkdtemp(prefix=f".build-{digest[:12]}-", dir=root))
    try:
        what = ", ".join(spec.requirements) or "no requirements"
        progress(f"image {digest[:12]}: building (python {interp.version}, {what}"
                 f"{', lock ' + spec.lock if spec.lock else ''}"
                 f"{', files ' + spec.files if spec.files else ''})")
        venv = tmp / "venv"
        _run([interp.python, "-m", "venv", "--without-pip", str(venv)], spec, progress)
        if spec.requirements or spec.lock:
            args = [*spec.requirements, *(["-r", spec.lock] if spec.lock else [])]
            _run(installer(venv / "bin/python", tmp) + args, spec, progress,
                 {"PYTHONPATH": str(tmp / "pip-only")})
        if (tmp / "pip-only").exists():
            shutil.rmtree(tmp / "pip-only")
        if spec.files:
            shutil.copytree(spec.files, tmp / "files", symlinks=True)
        site = venv / "lib" / f"python{interp.version}" / "site-packages"
        from importlib.metadata import distributions

        installed = sorted(f"{d.metadata['Name']}=={d.version}"
                           for d in distributions(path=[str(site)]))
        missing = sorted(set(map(_name, spec.requirements)) - {_name(p) for p in installed})
        if missing:
            raise ImageBuildError(f"image build failed: the installer succeeded but requirement "
                                  f"{', '.join(missing)} is not in the image (installed: "
                                  f"{installed})")
        meta = {"spec": {k: getattr(spec, k) for k in SPEC_KEYS}, "digest": digest,
                "python": interp.python, "python_version": interp.full_version,
                "installed": installed}
        (tmp / "spec.json").write_text(json.dumps(meta, indent=1) + "\n")
        _make_read_only(tmp)
        tmp.chmod(0o755)  # the top folder stays renamable/removable by its owner
        try:
            os.rename(tmp, final)
        except OSError:
            if not final.is_dir():
                raise
            _remove(tmp)  # another builder won the rename: theirs is the same image
    except BaseException:
        if tmp.exists():
            _remove(tmp)
        raise


def _name(requirement: str) -> str:
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    return canonicalize_name(Requirement(requirement.split("==")[0]).name)


def installer(venv_python: Path, tmp: Path) -> list[str]:
    """`uv pip install` where uv is on PATH, else this interpreter's pip aimed at the venv. pip
    runs from a folder holding only itself (tmp/pip-only), so neither it nor the venv it
    re-executes in sees the host's packages as "already satisfied"."""
    uv = shutil.which("uv")
    if uv:
        return [uv, "pip", "install", "--python", str(venv_python)]
    try:
        import pip
    except ImportError as exc:
        raise ImageBuildError("image build needs an installer: neither uv (on PATH) nor pip "
                              f"(in {sys.executable}) is available; install one") from exc
    (tmp / "pip-only").mkdir()
    (tmp / "pip-only" / "pip").symlink_to(Path(pip.__file__).parent)
    return [sys.executable, "-m", "pip", "--python", str(venv_python), "install",
            "--no-input", "--progress-bar", "off", "--disable-pip-version-check"]


def _run(argv: list[str], spec: ImageSpec, progress: Callable[[str], None],
         extra_env: Mapping[str, str] | None = None) -> None:
    # no PYTHONPATH & co: the installer must see the venv alone, or it finds the host's packages
    # "already satisfied" and installs nothing
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONUSERBASE", "VIRTUAL_ENV")}
    env.update(extra_env or {})
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env)
    lines = []
    for line in proc.stdout:
        lines.append(line.rstrip("\n"))
        progress(f"  | {lines[-1]}")
    if proc.wait() != 0:
        raise ImageBuildError(failure_message(argv, spec, lines))


def failure_message(argv: list[str], spec: ImageSpec, lines: list[str]) -> str:
    """Which requirement failed (the ones pip's error lines name), and pip's error."""
    errors = [ln for ln in lines if re.match(r"\s*(ERROR|error)\b", ln)] or lines[-15:]
    text = "\n".join(errors).lower()
    from packaging.requirements import Requirement

    named = [r for r in spec.requirements
             if Requirement(r).name.lower().replace("_", "-") in text.replace("_", "-")]
    if spec.lock and not named and spec.lock.lower() in " ".join(lines).lower():
        named = [f"lock file {spec.lock}"]
    which = (f"requirement {', '.join(named)} failed" if named
             else f"the command failed: {' '.join(argv[:6])} ...")
    return f"image build failed: {which}:\n" + "\n".join(errors)


def _make_read_only(root: Path) -> None:
    for dirpath, dirnames, filenames in os.walk(root):
        for name in filenames:
            p = Path(dirpath, name)
            if not p.is_symlink():
                p.chmod(stat.S_IMODE(p.stat().st_mode) & ~0o222)
        Path(dirpath).chmod(0o555)


def _remove(path: Path) -> None:
    def writable(func, p, _exc):
        os.chmod(os.path.dirname(p), 0o755)
        if os.path.isdir(p) and not os.path.islink(p):
            os.chmod(p, 0o755)
        func(p)

    shutil.rmtree(path, onexc=writable) if sys.version_info >= (3, 12) else shutil.rmtree(
        path, onerror=writable)


def remove_image(image: Image) -> None:
    """Delete a built image from the cache (it is read-only on disk)."""
    if image.path is not None:
        _remove(image.path)
        with _memo_lock:
            for key in [k for k, v in _memo.items() if v.path == image.path]:
                del _memo[key]
