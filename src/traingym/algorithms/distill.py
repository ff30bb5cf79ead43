"""On-policy distillation, the algorithm side: a teacher's per-token log-probs as the advantage.

The student samples as in RL; the trainer asks the teacher (trainer/teacher.py) for the log-prob
of each sampled token at the rollout temperature, once per batch. Each policy token gets
A_t = coef (log p_teacher - log p_student) + reward_coef A_group: the negated k1 estimate of
KL(student || teacher), optionally mixed with the wrapped algorithm's group advantage; the loss
is the plain policy gradient, token-level averaged (Agarwal et al. 2024; Lu & Thinking Machines
2025). `distilling` gives the run's algorithm class this step: it keeps every group and takes
no KL-to-reference, entropy or clip term; `kl` is then the mean of log p_student - log p_teacher.
Not covered (refused by the config): PPO's value head, LoRA students, data-parallel, async mode.
"""

from __future__ import annotations

import dataclasses

import torch


def keeping_all_groups(cls: type) -> type:
    """`cls` (an algorithms/base.py Algorithm) with `drop_equal_groups = False`."""
    return type(f"{cls.__name__}KeepingAllGroups", (cls,), {"drop_equal_groups": False})


def distilling(cls: type, coef: float, reward_coef: float) -> type:
    """`cls` (an algorithms/base.py Algorithm) whose step is on-policy distillation."""
    return type(f"{cls.__name__}Distilling", (Distillation, keeping_all_groups(cls)),
                {"coef": coef, "reward_coef": reward_coef})


class Distillation:
    """Mixin over an Algorithm (see `distilling`): the trainer passes the teacher's
    log-probs to `teacher_advantages`; the loss is the plain policy gradient."""

    needs_teacher = True  # the trainer asks its teacher once per batch (trainer/teacher.py)
    coef, reward_coef = 1.0, 0.0

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # the distillation step has no KL-to-reference or entropy term
        self.knobs = dataclasses.replace(self.knobs, kl_coef=0.0, entropy_coef=0.0)

    @property
    def needs_reference(self) -> bool:
        return False

    @property
    def token_level(self) -> bool:
        return False

    def teacher_advantages(self, student_B_T, teacher_B_T, adv_B, mask_B_T) -> torch.Tensor:
        return distill_advantages(student_B_T, teacher_B_T, adv_B, mask_B_T, self.coef,
                                  self.reward_coef)

    def token_loss(self, logp_B_T, old_logp_B_T, adv_B_T, mask_B_T):
        """-A_t log p(y_t), nothing clipped."""
        return -adv_B_T * logp_B_T, torch.zeros_like(mask_B_T)

    def token_weights(self, mask_B_T: torch.Tensor) -> torch.Tensor:
        return mask_B_T

    def denominator(self, batch) -> float:
        """The batch's policy tokens (token-level averaging)."""
        return float(sum(sum(s.loss_mask) for g in batch.groups for s in g.samples))


def distill_advantages(student_B_T, teacher_B_T, adv_B, mask_B_T, coef: float,
                       reward_coef: float) -> torch.Tensor:
    """A_t = coef (teacher - student) + reward_coef A_group, 0 off the policy tokens."""
    adv = coef * (teacher_B_T - student_B_T) + reward_coef * adv_B.to(student_B_T)[:, None]
    return adv * mask_B_T
