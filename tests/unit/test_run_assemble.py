"""loop/build.py `_assemble`: when a step after the trainer is built fails (here the first weight
publish; the run log and a resume from a checkpoint come in the same window), the trainer is
closed (it may own a process: a distillation teacher's vLLM worker) and so is the engine,
and the error reaches the caller."""

from __future__ import annotations

import pytest

import traingym
from traingym.loop import build as run_mod


def test_a_failure_after_build_trainer_closes_the_trainer_and_the_engine(tmp_path, monkeypatch):
    closed = []
    real_trainer, real_engine = run_mod.build_trainer, run_mod.build_engine

    def trainer(*args, **kwargs):
        t = real_trainer(*args, **kwargs)
        monkeypatch.setattr(t, "close", lambda: closed.append("trainer"))
        return t

    def engine(*args, **kwargs):
        e, tok = real_engine(*args, **kwargs)
        monkeypatch.setattr(e, "close", lambda: closed.append("engine"))
        return e, tok

    class FailingSync:
        def __init__(self, *args, **kwargs):
            raise RuntimeError("the first publish failed")

    monkeypatch.setattr(run_mod, "build_trainer", trainer)
    monkeypatch.setattr(run_mod, "build_engine", engine)
    monkeypatch.setattr(run_mod, "ColocatedSync", FailingSync)
    cfg = traingym.build_config("tiny", overrides={"steps": 1, "eval": {"before": False,
                                                                         "after": False}})
    with pytest.raises(RuntimeError, match="the first publish failed"):
        traingym.train(cfg, run_dir=tmp_path / "run", progress=False)
    assert closed == ["trainer", "engine"]
