"""What `traingym serve` accepts: a run directory serves its newest committed checkpoint; a
run without one, a missing path, and a checkpoint whose files do not match its manifest are
one-line errors (exit 2) before any server starts."""

import os
import shutil
import subprocess
import sys

import pytest

from traingym.serve.loading import resolve


def test_run_dir_resolves_to_newest_committed_checkpoint(tiny_checkpoint):
    run_dir = tiny_checkpoint.parent.parent
    assert resolve(str(run_dir)) == ("checkpoint", tiny_checkpoint, run_dir)
    assert resolve(str(tiny_checkpoint)) == ("checkpoint", tiny_checkpoint, run_dir)
    assert resolve("tiny")[0] == "model"


def test_run_without_checkpoint_and_missing_path(tmp_path):
    (tmp_path / "run" / "checkpoints").mkdir(parents=True)
    with pytest.raises(FileNotFoundError, match="no committed checkpoint"):
        resolve(str(tmp_path / "run"))
    with pytest.raises(FileNotFoundError, match="does not exist"):
        resolve(str(tmp_path / "nope"))


def test_altered_checkpoint_is_refused(tiny_checkpoint, tmp_path):
    run = tmp_path / "copy"
    shutil.copytree(tiny_checkpoint.parent.parent, run)
    ckpt = run / "checkpoints" / tiny_checkpoint.name
    with open(ckpt / "model.safetensors", "r+b") as f:
        f.seek(-8, 2)
        f.write(b"\x00" * 8)
    r = subprocess.run([sys.executable, "-m", "traingym.cli", "serve", str(run)], timeout=300,
                       capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 2, r.stderr[-2000:]
    assert r.stderr.startswith("traingym: cannot serve") and "sha256" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
