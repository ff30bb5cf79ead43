"""A run directory written before PPO's knobs moved into algorithms/ppo.py (its config.json
holds gamma, lam, ... for every algorithm) still reads, evaluates and resumes."""

import json

import traingym
from traingym.config.load import run_config
from traingym.loop.build import prepare_run_dir

OLD_PPO_DEFAULTS = {"gamma": 1.0, "lam": 0.95, "vf_coef": 0.1, "value_clip": 0.2,
                    "whiten_advantages": True, "value_lr_scale": 1.0}


def _old_run(tmp_path, name: str):
    cfg = traingym.build_config("tiny", overrides={"algorithm": {"name": name}})
    data = cfg.model_dump(mode="json")
    data["algorithm"] = {**{k: v for k, v in data["algorithm"].items()
                            if k not in OLD_PPO_DEFAULTS}, **OLD_PPO_DEFAULTS}
    run_dir = tmp_path / name
    run_dir.mkdir()
    (run_dir / "config.json").write_text(json.dumps(data))
    return cfg, run_dir


def test_an_old_grpo_run_reads_and_resumes(tmp_path):
    cfg, run_dir = _old_run(tmp_path, "grpo")
    assert "gamma" not in run_config(run_dir).algorithm.model_dump()
    prepare_run_dir(run_dir, cfg, resume=True)  # no "config differs" refusal


def test_an_old_ppo_run_keeps_its_knobs(tmp_path):
    cfg, run_dir = _old_run(tmp_path, "ppo")
    assert run_config(run_dir).algorithm.lam == 0.95
    prepare_run_dir(run_dir, cfg, resume=True)


def test_a_new_config_records_its_algorithm_s_own_defaults():
    ppo = traingym.build_config("tiny", overrides={"algorithm": {"name": "ppo"}})
    assert ppo.model_dump()["algorithm"]["gamma"] == 1.0
    assert "gamma" not in traingym.build_config("tiny").model_dump()["algorithm"]
