"""One tiny training run shared by the eval tests (about 25 s on the 2-core CPU): the tiny
preset with checkpoints after steps 2 and 4 and the run's held-out eval before and after.
Tests that change a run work on a copy (`copy_run`)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory) -> Path:
    import traingym

    run_dir = tmp_path_factory.mktemp("eval_run") / "run"
    cfg = traingym.build_config("tiny", overrides={"checkpoint": {"every": 2}})
    traingym.train(cfg, run_dir=run_dir, progress=False)
    return run_dir


@pytest.fixture
def copy_run(tiny_run, tmp_path):
    def make(name: str = "copy") -> Path:
        dst = tmp_path / name
        shutil.copytree(tiny_run, dst)
        return dst

    return make
