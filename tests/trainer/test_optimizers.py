"""trainer.optimizer ('adamw_8bit') and trainer.optimizer_in_backward: the in-backward step is
the usual one, grad_clip = 0 turns clipping off, both resume from checkpoints bitwise, and the
config refuses what cannot run, naming the fix."""

import importlib.util
import random

import pytest
import torch
from prereq import require
from safetensors.torch import load_file

import traingym
from traingym.core.errors import ConfigError
from traingym.core.types import Batch, Group, Sample
from traingym.models.loader import tiny_model, tiny_tokenizer
from traingym.trainer.config import TrainerConfig
from traingym.trainer.torch_trainer import TorchTrainer

NO_BNB = "trainer.optimizer='adamw_8bit' needs bitsandbytes (pip install -e '.[memory]')"


def _batch(seed, groups=5, size=4):
    rng = random.Random(seed)
    out, adv = [], []
    for gi in range(groups):
        prompt = tuple(rng.randrange(3, 300) for _ in range(rng.randint(2, 9)))
        samples = []
        for _ in range(size):
            n = rng.randint(1, 7)
            samples.append(Sample(prompt, [rng.randrange(3, 300) for _ in range(n)],
                                  [-1.0] * n, [0] * n, {}))
        out.append(Group(samples, gi))
        adv.append([rng.uniform(-1, 1) for _ in range(size)])
    return Batch(out, adv)


def _trainer(**cfg):
    tok = tiny_tokenizer()
    model = tiny_model(tok, seed=3)
    cfg = TrainerConfig(lr=1e-2, bf16_autocast=False, **{"grad_clip": 0.0, **cfg})
    return TorchTrainer(model, cfg, 1.0, tok.pad_token_id)


def _params(trainer):
    return [p.detach().clone() for p in trainer.model.parameters()]


@pytest.mark.parametrize("optimizer", ["adamw", "adamw_8bit"])
def test_in_backward_step_equals_the_usual_step(optimizer):
    if optimizer == "adamw_8bit":
        require("bitsandbytes", NO_BNB)
    batch = _batch(seed=4)
    usual = _trainer(optimizer=optimizer, micro_batch_groups=100)
    fused = _trainer(optimizer=optimizer, optimizer_in_backward=True)
    before = _params(usual)
    m_usual, m_fused = usual.train_step(batch), fused.train_step(batch)
    assert all(p.grad is None for p in fused.model.parameters())  # freed in the hooks
    assert m_fused["grad_norm"] == pytest.approx(m_usual["grad_norm"], rel=1e-6)
    assert m_fused["loss"] == pytest.approx(m_usual["loss"], rel=1e-6, abs=1e-9)
    moved = 0
    for a, b, p0 in zip(_params(usual), _params(fused), before):
        torch.testing.assert_close(b, a, atol=1e-6, rtol=0)
        moved += int(not torch.equal(a, p0))
    assert moved == len(before)  # every parameter took the step
    # the optimizer states agree too (the next step depends on them)
    s_usual = usual.optimizer.state_dict()["state"]
    s_fused = fused.optimizer.state_dict()["state"]  # keyed alike, filled in another order
    assert s_usual.keys() == s_fused.keys()
    for i, su in s_usual.items():
        sf = s_fused[i]
        assert su.keys() == sf.keys()
        for k in su:
            torch.testing.assert_close(torch.as_tensor(sf[k]), torch.as_tensor(su[k]),
                                       atol=1e-6, rtol=0)


def test_in_backward_matches_micro_batched_steps():
    """Against the default micro-batches (several passes): equal to float rounding, 2 steps."""
    usual, fused = _trainer(), _trainer(optimizer_in_backward=True)
    for seed in (5, 6):
        batch = _batch(seed=seed)
        assert len(usual._chunks(batch.groups, batch.advantages_G)) > 1
        usual.train_step(batch), fused.train_step(batch)
    for a, b in zip(_params(usual), _params(fused)):
        torch.testing.assert_close(b, a, atol=1e-4, rtol=0)


def test_grad_clip_zero_steps_unclipped_and_reports_the_norm():
    batch = _batch(seed=7)
    off, huge = _trainer(grad_clip=0.0), _trainer(grad_clip=1e9)
    m_off, m_huge = off.train_step(batch), huge.train_step(batch)
    assert m_off["grad_norm"] == pytest.approx(m_huge["grad_norm"], rel=1e-6)
    assert m_off["grad_norm"] > 0.1  # above the default clip of 1.0 would bind at this lr
    for a, b in zip(_params(off), _params(huge)):
        torch.testing.assert_close(a, b, atol=1e-7, rtol=0)


def test_in_backward_non_finite_gradient_raises_after_the_step():
    trainer = _trainer(optimizer_in_backward=True)
    with torch.no_grad():
        trainer.model.model.norm.weight[0] = float("nan")
    with pytest.raises(FloatingPointError, match="already stepped"):
        trainer.train_step(_batch(seed=8))


def test_close_removes_the_hooks():
    trainer = _trainer(optimizer_in_backward=True)
    trainer.close()
    before = _params(trainer)
    sum(p.sum() for p in trainer.model.parameters()).backward()
    assert all(p.grad is not None for p in trainer.model.parameters())
    assert all(torch.equal(a, b) for a, b in zip(before, _params(trainer)))


def _cfg(steps, trainer):
    return traingym.build_config("tiny", overrides={
        "steps": steps, "checkpoint": {"every": 2}, "eval": {"before": False, "after": False},
        "trainer": trainer})


@pytest.mark.parametrize("trainer", [
    {"optimizer": "adamw_8bit"},
    {"optimizer_in_backward": True, "grad_clip": 0.0},
    {"optimizer": "adamw_8bit", "optimizer_in_backward": True, "grad_clip": 0.0},
], ids=["8bit", "in_backward", "8bit_in_backward"])
def test_resume_is_bitwise_identical(tmp_path, trainer):
    if trainer.get("optimizer") == "adamw_8bit":
        require("bitsandbytes", NO_BNB)
    straight, split = tmp_path / "straight", tmp_path / "split"
    traingym.train(_cfg(4, trainer), run_dir=straight, progress=False)
    traingym.train(_cfg(2, trainer), run_dir=split, progress=False)
    traingym.train(_cfg(4, trainer), run_dir=split, resume=True, progress=False)
    a, b = straight / "checkpoints/step_000004", split / "checkpoints/step_000004"
    for name in ("model.safetensors", "optimizer.safetensors"):
        ta, tb = load_file(a / name), load_file(b / name)
        assert ta.keys() == tb.keys()
        for key in ta:
            assert torch.equal(ta[key], tb[key]), f"{name}:{key} differs"
    if trainer.get("optimizer") == "adamw_8bit":  # the 8-bit moments were saved as such
        opt = load_file(a / "optimizer.safetensors")
        assert any(v.dtype == torch.uint8 for v in opt.values())
        assert not any(k.endswith(("qmap1", "qmap2")) for k in opt)


@pytest.mark.parametrize("trainer, words", [
    ({"optimizer_in_backward": True}, "trainer.grad_clip = 0"),
    ({"optimizer_in_backward": True, "grad_clip": 0, "micro_batch_tokens": 64},
     "trainer.micro_batch_tokens = 0"),
    ({"optimizer_in_backward": True, "grad_clip": 0, "data_parallel": 2},
     "trainer.data_parallel = 1"),
    ({"optimizer": "adamw_8bit", "data_parallel": 2}, "trainer.data_parallel = 1"),
    ({"optimizer": "adam8bit"}, "adamw_8bit"),
])
def test_refusals_name_the_fix(trainer, words):
    if trainer.get("optimizer") == "adamw_8bit":
        require("bitsandbytes", NO_BNB)
    with pytest.raises((ConfigError, ValueError), match=words.replace(".", r"\.")):
        traingym.build_config("tiny", overrides={"trainer": trainer})


def test_in_backward_refuses_a_value_head():
    with pytest.raises((ConfigError, ValueError), match="optimizer_in_backward = false"):
        traingym.build_config("tiny", overrides={
            "algorithm": {"name": "ppo"},
            "trainer": {"optimizer_in_backward": True, "grad_clip": 0}})


def test_8bit_without_bitsandbytes_names_the_extra(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "bitsandbytes" else real(name, *a))
    with pytest.raises((ConfigError, ValueError), match=r"traingym\[memory\]"):
        traingym.build_config("tiny", overrides={"trainer": {"optimizer": "adamw_8bit"}})
