"""Samples marked dropped (StepResult.drop -> Sample.drop_reason: a judge that failed under
on_failure='drop') are left out of evaluation means, pass@k, paired differences, group rewards
and the training batch (evaluate.py, envs/group.py, algorithms/base.py)."""

import math

import pytest

from traingym.loop.trainer import build_algorithm
from traingym.envs.group import score_group
from traingym.envs.evaluate import Score, group_means, paired_difference, pass_at_k_score
from traingym.core.types import Group, Sample


def _sample(reward: float, drop: str | None = None) -> Sample:
    return Sample(prompt_ids=(1,), completion_ids=[2], completion_logprobs=[0.0], versions=[0],
                  example={"prompt": "p"}, reward=reward, drop_reason=drop)


def _group(index: int, *rewards: float | str) -> Group:
    """A group from rewards; a string is a dropped sample (its reward a placeholder 0.0)."""
    return Group([_sample(0.0, r) if isinstance(r, str) else _sample(r) for r in rewards],
                 index)


def test_group_means_leave_dropped_samples_out():
    s = group_means([_group(0, 1.0, "judge: timeout", 0.0), _group(1, "a", "b"),
                     _group(2, 0.5, 0.5)])
    assert s.per_prompt[0] == 0.5  # not (1 + 0 + 0) / 3
    assert math.isnan(s.per_prompt[1])  # every sample dropped: NaN, kept in place
    assert s.per_prompt[2] == 0.5
    assert s.n_prompts == 2 and s.mean == 0.5 and s.se == 0.0


def test_every_prompt_dropped_is_an_error_naming_the_fix():
    with pytest.raises(ValueError, match="no prompt left to score: all 2 .*on_failure"):
        group_means([_group(0, "a"), _group(1, "b", "c")])


def test_pass_at_k_with_fewer_than_k_samples_left():
    # prompt 0: 3 samples kept (1 passes); prompt 1: 1 kept, too few for pass@2
    s = pass_at_k_score([[True, False, False], [True]], 2)
    assert s.per_prompt[0] == pytest.approx(1 - (2 * 1) / (3 * 2))  # 1 - C(2,2)/C(3,2)
    assert math.isnan(s.per_prompt[1]) and s.n_prompts == 1
    assert pass_at_k_score([[True, False, False], [True]], 1).n_prompts == 2
    with pytest.raises(ValueError, match="no prompt left to score"):
        pass_at_k_score([[True], []], 2)


def test_paired_difference_skips_prompts_not_counted_in_both():
    after = Score(0.0, 0.0, 3, [1.0, math.nan, 0.5, 0.75])
    before = Score(0.0, 0.0, 3, [0.0, 0.25, math.nan, 0.25])
    d = paired_difference(after, before)  # prompts 0 and 3: diffs 1.0 and 0.5
    assert d["delta"] == pytest.approx(0.75)
    assert d["se"] == pytest.approx(0.25)  # sd 0.3536 / sqrt(2)
    assert d["z"] == pytest.approx(3.0)


def test_paired_difference_without_overlap_says_so():
    after = Score(1.0, 0.0, 1, [1.0, math.nan])
    before = Score(0.0, 0.0, 1, [math.nan, 0.0])
    with pytest.raises(ValueError, match=r"no prompt is counted in both evaluations \(after: "
                                         r"1 of 2, before: 1 of 2"):
        paired_difference(after, before)
    with pytest.raises(ValueError, match="2 prompts after but 3 before"):
        paired_difference(after, Score(0.0, 0.0, 3, [0.0, 0.0, 0.0]))


def test_a_group_reward_never_sees_dropped_samples():
    seen = []

    def rank(samples):
        seen.append([s.reward for s in samples])
        return [float(i) for i in range(len(samples))]

    samples = [_sample(0.9), _sample(0.0, "judge: timeout"), _sample(0.4)]
    assert score_group(rank, samples) == [0.0, 0.0, 1.0]  # the dropped one keeps 0.0
    assert seen == [[0.9, 0.4]]
    seen.clear()
    assert score_group(rank, [_sample(0.0, "a"), _sample(0.0, "b")]) == [0.0, 0.0]
    assert seen == []  # nothing left to score: not called


def test_the_batch_leaves_a_group_with_a_dropped_sample_out():
    import traingym

    algo = build_algorithm(traingym.build_config("tiny"))
    batch = algo.build_batch([_group(0, 1.0, "judge: x"), _group(1, 1.0, 0.0)])
    assert [g.index for g in batch.groups] == [1] and batch.num_dropped_groups == 1
