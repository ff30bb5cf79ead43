"""On-policy distillation: advantages by hand; a better-trained teacher lifts an untrained
student's held-out reward end to end (tiny)."""

import pytest
import torch

from traingym.loop.trainer import build_algorithm
import traingym
from traingym.algorithms.distill import distill_advantages
from traingym.trainer.teacher import load_teacher


def test_advantages_by_hand():
    student = torch.tensor([[-1.0, -2.0, -0.5], [-0.1, 0.0, 0.0]])
    teacher = torch.tensor([[-0.5, -3.0, -0.5], [-0.4, -9.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    adv_B = torch.tensor([0.25, -0.5])
    got = distill_advantages(student, teacher, adv_B, mask, coef=2.0, reward_coef=0.0)
    assert torch.allclose(got, torch.tensor([[1.0, -2.0, 0.0], [-0.6, 0.0, 0.0]]))
    got = distill_advantages(student, teacher, adv_B, mask, coef=1.0, reward_coef=2.0)
    assert torch.allclose(got, torch.tensor([[1.0, -0.5, 0.5], [-1.3, 0.0, 0.0]]))


def test_teacher_must_be_trained_first(tmp_path):
    (tmp_path / "run" / "checkpoints").mkdir(parents=True)
    with pytest.raises(FileNotFoundError, match="no committed checkpoint"):
        load_teacher(str(tmp_path / "run"), "tiny")


def test_a_better_teacher_lifts_an_untrained_student(tmp_path):
    ev = {"num_prompts": 32, "samples_per_prompt": 4}
    teacher = traingym.train(traingym.build_config("tiny", overrides={
        "steps": 16, "eval": ev, "trainer": {"lr": 3e-3}}), run_dir=tmp_path / "t",
        progress=False)
    assert teacher.eval["delta"]["sampled"]["delta"] > 0
    student = traingym.train(traingym.build_config("tiny", overrides={
        "steps": 8, "eval": ev, "trainer": {"lr": 3e-3},
        "distill": {"teacher": str(tmp_path / "t"), "coef": 1.0}}),
        run_dir=tmp_path / "s", progress=False)
    d = student.eval["delta"]["sampled"]
    assert d["delta"] > 0 and d["delta"] > 2 * d["se"], d  # pure distillation: no reward used
    # the student moved towards the teacher, not past it
    assert student.eval["after"]["sampled"]["mean"] <= teacher.eval["after"]["sampled"]["mean"] + 0.02


def test_distillation_keeps_equal_reward_groups():
    from traingym.core.types import Group, Sample

    cfg = traingym.build_config("tiny", overrides={"distill": {"teacher": "tiny"}})
    same = Group([Sample((1, 2), [3], [-1.0], [0], {}, reward=0.5) for _ in range(4)], 0)
    batch = build_algorithm(cfg).build_batch([same])
    assert len(batch.groups) == 1 and batch.advantages_G == [[0.0] * 4]
    plain = build_algorithm(traingym.build_config("tiny")).build_batch([same])
    assert plain.groups == [] and plain.num_dropped_groups == 1
