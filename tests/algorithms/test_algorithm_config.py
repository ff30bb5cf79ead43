"""The `algorithm` section: names checked against the registry, knobs that need another set,
combinations the trainer cannot run refused before any work, old keys naming the new place."""

import pytest

import traingym
from traingym.core.errors import ConfigError


def _cfg(**over):
    return traingym.build_config("tiny", overrides=over)


def test_algorithm_section_errors_name_the_fix():
    assert _cfg(algorithm={"name": "dapo"}).algorithm.name == "dapo"
    with pytest.raises(ConfigError, match="unknown algorithm.name 'dapp'.*did you mean 'dapo'"):
        _cfg(algorithm={"name": "dapp"})
    with pytest.raises(ConfigError, match="apply only with algorithm.kl_coef > 0"):
        _cfg(algorithm={"kl_estimator": "k1"})
    with pytest.raises(ConfigError, match="use kl_in='loss' or trainer.data_parallel=1"):
        _cfg(algorithm={"kl_coef": 0.1, "kl_in": "reward"}, trainer={"data_parallel": 2})
    with pytest.raises(ConfigError, match="set entropy_coef=0 or trainer.gradient_checkpointing"):
        _cfg(algorithm={"entropy_coef": 0.01}, trainer={"gradient_checkpointing": True})
    with pytest.raises(ConfigError, match="max_sample_rounds applies only with dynamic_sampling"):
        _cfg(algorithm={"dynamic_sampling": False, "max_sample_rounds": 2})


@pytest.mark.parametrize("key,value", [("clip_low", 0.1), ("clip_high", 0.3),
                                       ("kl_coef", 0.1), ("normalize_std", True)])
def test_old_trainer_keys_name_their_new_place(key, value):
    with pytest.raises(ConfigError, match=f"'trainer.{key}' has moved to 'algorithm.{key}'"):
        _cfg(trainer={key: value})
