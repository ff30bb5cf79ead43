"""The lora / sft / distill sections and the trainer extras refuse what they cannot run, naming
the fix."""

import pytest

import traingym
from traingym.core.errors import ConfigError


@pytest.mark.parametrize("overrides, words", [
    ({"lora": {"alpha": 4.0}}, "lora.rank > 0"),
    ({"lora": {"rank": 4}, "trainer": {"data_parallel": 2}}, "trainer.data_parallel = 1"),
    ({"lora": {"rank": 4, "sync": "adapter"}, "mode": "async",
      "weights": {"transport": "tcp"}}, "lora.sync='merged'"),
    ({"sft": {"lr": 1e-3}}, "only with sft.data"),
    ({"distill": {"coef": 0.5}}, "only with distill.teacher"),
    ({"distill": {"teacher": "tiny", "coef": 0.0}}, "nothing to learn from"),
    ({"distill": {"teacher": "tiny"}, "lora": {"rank": 2}}, "lora.rank = 0"),
    ({"lora": {"base_dtype": "bfloat16"}}, "lora.rank > 0"),
    ({"lora": {"rank": 2, "base_dtype": "bfloat16"}, "trainer": {"bf16_autocast": False}},
     "lora.base_dtype='float32'"),
])
def test_refusals_name_the_fix(overrides, words):
    with pytest.raises((ConfigError, ValueError), match=words.replace(".", r"\.").replace(
            "(", r"\(").replace(")", r"\)")):
        traingym.build_config("tiny", overrides=overrides)


def test_defaults_are_off():
    cfg = traingym.build_config("tiny")
    assert cfg.lora.rank == 0 and cfg.sft.data is None and cfg.distill.teacher is None
    assert cfg.trainer.micro_batch_tokens == 0 and cfg.trainer.gradient_checkpointing is False
