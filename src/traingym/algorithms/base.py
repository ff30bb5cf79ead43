"""The algorithm seam: what an RL algorithm supplies, and what it asks of the trainer.

An algorithm is one class (one file) plus one line in algorithms/registry.py. It supplies the
batch (`build_batch`: reward shaping, group or batch advantages, groups without signal dropped,
overlong filtering), per-token advantages that need the trainer's pass (`token_advantages`),
the per-token loss with its weights and constant divisor (`token_loss`, `token_weights`,
`denominator`: micro-batches and ranks add up to one pass over the batch), and declares what it
needs (`needs_reference`, `wants_more`, `needs_values`, `needs_teacher`; config/rules.py checks
them against the run). The trainer applies the shared KL, entropy and importance terms. `Knobs`
resolves the `algorithm` section: None takes `DEFAULTS`, then `BASE_DEFAULTS`.
Not covered: a separate critic model, several optimizer epochs per batch (the ratio is 1 in
value, so clip ranges never bind in training), per-token advantages across data-parallel ranks.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch
from pydantic import BaseModel

from traingym.algorithms.losses import clipped_surrogate, kl_estimate
from traingym.core.errors import Strict
from traingym.core.types import Batch, Group

BASE_DEFAULTS = {"normalize_std": False, "clip_low": 0.2, "clip_high": 0.28,
                 "dynamic_sampling": False, "overlong_filter": False, "overlong_buffer": 0}


@dataclass(frozen=True)
class Knobs:
    normalize_std: bool = False
    clip_low: float = 0.2
    clip_high: float = 0.28
    kl_coef: float = 0.0
    kl_estimator: str = "k3"
    kl_in: str = "loss"
    entropy_coef: float = 0.0
    dynamic_sampling: bool = False
    max_sample_rounds: int = 4
    overlong_filter: bool = False
    overlong_buffer: int = 0
    overlong_penalty: float = 1.0
    max_new_tokens: int = 8  # rollout.max_new_tokens: the length limit of the overlong rules
    routing_replay: bool = False  # MoE policies: replay the engine's routes (trainer/replay.py)
    moe_aux_loss_coef: float = 0.0  # MoE policies: load-balancing loss (trainer/moe_aux.py)


class Algorithm:
    """GRPO's behaviour, the default every algorithm overrides in part."""

    name = "grpo"
    DEFAULTS: dict = {}  # this algorithm's defaults for the shared knobs left at None

    class Options(Strict):
        """The algorithm's own knobs (`algorithm.<key>`); GRPO has none."""
    drop_equal_groups = True  # group-relative: all-equal rewards carry no signal
    needs_values = False  # a value head (algorithms/ppo.py)
    needs_teacher = False  # teacher log-probs per token (trainer/teacher.py)
    check = None  # optional classmethod check(cfg): its own refusals (ValueError naming the fix)

    def __init__(self, knobs: Knobs | None = None, options: BaseModel | None = None):
        self.knobs = knobs or self.resolve()
        self.options = options if options is not None else self.Options()

    @classmethod
    def resolve(cls, section=None, max_new_tokens: int = 8) -> Knobs:
        """Knobs from an AlgorithmConfig (None: every default)."""
        given = section.model_dump() if section is not None else {}
        values = {}
        for f in fields(Knobs):
            v = given.get(f.name)
            if v is None:
                v = cls.DEFAULTS.get(f.name, BASE_DEFAULTS.get(f.name, f.default))
            values[f.name] = v
        values["max_new_tokens"] = max_new_tokens
        if values["overlong_buffer"] is None or values["overlong_buffer"] == "fifth":
            values["overlong_buffer"] = max_new_tokens // 5
        return Knobs(**values)

    @classmethod
    def from_section(cls, section, max_new_tokens: int) -> Algorithm:
        """From the `algorithm` section and rollout.max_new_tokens (the overlong rules)."""
        return cls(cls.resolve(section, max_new_tokens), cls.Options(**(section.model_extra or {})))

    def metrics(self, batch: Batch) -> dict[str, float]:
        """Figures of this algorithm about a built batch, added to the step's record."""
        return {}

    # -- what the trainer provides ------------------------------------------------------------
    @property
    def needs_reference(self) -> bool:
        return self.knobs.kl_coef > 0

    @property
    def token_level(self) -> bool:
        """Per-token advantages from the trainer's pass (KL as a reward penalty)."""
        return self.knobs.kl_coef > 0 and self.knobs.kl_in == "reward"

    @property
    def wants_more(self) -> bool:
        return self.knobs.dynamic_sampling

    # -- the batch -------------------------------------------------------------------------------
    def shaped_reward(self, sample) -> float:
        """The reward the advantages see: the soft overlong penalty (DAPO eq. 13) when
        `overlong_buffer` > 0, over the sample's policy tokens against rollout.max_new_tokens."""
        k = self.knobs
        if k.overlong_buffer <= 0:
            return sample.reward
        length, limit = sum(sample.loss_mask), k.max_new_tokens
        start = limit - k.overlong_buffer
        if length <= start:
            return sample.reward
        if length <= limit:
            return sample.reward + (start - length) / k.overlong_buffer * k.overlong_penalty
        return sample.reward - k.overlong_penalty

    def group_advantages(self, rewards_G: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
        """Mean-centred rewards, optionally divided by the group's (population) std."""
        centred_G = rewards_G - rewards_G.mean()
        if self.knobs.normalize_std:
            centred_G = centred_G / (rewards_G.std(unbiased=False) + eps)
        return centred_G

    def batch_advantages(self, rewards: list[torch.Tensor], groups: list[Group]) -> list:
        """Advantages of the kept groups; group-relative by default."""
        return [self.group_advantages(r_G) for r_G in rewards]

    def build_batch(self, groups: list[Group]) -> Batch:
        """Advantages for every group; groups with all-equal (shaped) rewards, or with a
        sample marked dropped (Sample.drop_reason), dropped and counted. After the groups'
        advantages are computed, samples with no completion tokens (a model that stopped at
        once, from a server that does not report the stop token) are removed, having nothing
        to train on, and with `overlong_filter` truncated samples too; a group left empty is
        dropped and counted."""
        kept, rewards, dropped = [], [], 0
        for group in groups:
            if any(s.drop_reason for s in group.samples):  # a reward unknown (envs/judge.py)
                dropped += 1
                continue
            r_G = torch.tensor([self.shaped_reward(s) for s in group.samples],
                               dtype=torch.float64)
            if self.drop_equal_groups and bool((r_G == r_G[0]).all()):
                dropped += 1
                continue
            kept.append(group)
            rewards.append(r_G)
        advantages = [a.tolist() for a in self.batch_advantages(rewards, kept)]
        kept, advantages, empty = _keep(kept, advantages, lambda s: len(s.completion_ids) > 0)
        dropped += empty
        if self.knobs.overlong_filter:
            kept, advantages, empty = _keep(kept, advantages, lambda s: s.finish_reason != "length")
            dropped += empty
        return Batch(groups=kept, advantages_G=advantages, num_dropped_groups=dropped)

    # -- per-token advantages ----------------------------------------------------------------------
    def token_advantages(self, parts: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]
                         ) -> list[torch.Tensor]:
        """parts: per micro-batch (adv_B, kl_B_T, mask_B_T) -> adv_B_T: the sample's
        advantage minus kl_coef x the KL's return-to-go (sum over this and later tokens)."""
        return [adv_B[:, None] - self.knobs.kl_coef * return_to_go(kl_B_T * mask_B_T)
                for adv_B, kl_B_T, mask_B_T in parts]

    # -- the loss --------------------------------------------------------------------------------
    def token_loss(self, logp_B_T, old_logp_B_T, adv_B_T, mask_B_T):
        """(per-token policy-gradient loss, per-token clipped flag): PPO's clipped surrogate."""

        return clipped_surrogate(logp_B_T, old_logp_B_T, adv_B_T, self.knobs.clip_low,
                                 self.knobs.clip_high)

    def token_weights(self, mask_B_T: torch.Tensor) -> torch.Tensor:
        """Each token's weight in the loss sum (token-level averaging: the mask)."""
        return mask_B_T

    def denominator(self, batch: Batch) -> float:
        """The batch's loss divisor: its policy tokens (token-level averaging)."""
        return float(sum(sum(s.loss_mask) for g in batch.groups for s in g.samples))

    def kl(self, logp_B_T, ref_B_T) -> torch.Tensor:
        return kl_estimate(logp_B_T, ref_B_T, self.knobs.kl_estimator)


def return_to_go(x_B_T: torch.Tensor) -> torch.Tensor:
    """sum_{s >= t} x[:, s] for every t."""
    return x_B_T.flip(-1).cumsum(-1).flip(-1)


def _keep(groups, advantages, wanted):
    """The samples for which `wanted(sample)`, with their advantages; -> (groups, advantages,
    how many groups were left empty and removed)."""
    out_g, out_a, empty = [], [], 0
    for g, adv in zip(groups, advantages):
        keep = [i for i, s in enumerate(g.samples) if wanted(s)]
        if not keep:
            empty += 1
            continue
        out_g.append(Group([g.samples[i] for i in keep], g.index))
        out_a.append([adv[i] for i in keep])
    return out_g, out_a, empty
