"""Each algorithm's batch (advantages, dropping, shaping, filtering) against values computed by
hand on small groups; GRPO against the functions it replaced (algorithms/advantages.py)."""

import dataclasses

import pytest
import torch

from traingym.algorithms import registry
from traingym.algorithms.advantages import build_batch as old_build_batch
from traingym.algorithms.base import Algorithm, Knobs
from traingym.core.types import Group, Sample


def _group(rewards, index=0, lengths=None, finish=None):
    lengths = lengths or [1] * len(rewards)
    finish = finish or ["stop"] * len(rewards)
    return Group([Sample((1,), [2] * n, [0.0] * n, [0] * n, {}, reward=r, finish_reason=f)
                  for r, n, f in zip(rewards, lengths, finish)], index)


def _algo(name, max_new_tokens=8, **knobs):
    """The algorithm with its defaults, then `knobs`."""
    cls = registry.get(name)
    return cls(dataclasses.replace(cls.resolve(None, max_new_tokens), **knobs))


def test_every_name_resolves_to_an_algorithm():
    for name in registry.names():
        assert issubclass(registry.get(name), Algorithm)
    with pytest.raises(ValueError, match="did you mean 'gspo'"):
        registry.get("gpso")
    with pytest.raises(ValueError, match="not a subclass"):
        registry.get("traingym.core.types:Batch")


@pytest.mark.parametrize("normalize_std", [False, True])
def test_grpo_equals_the_old_build_batch(normalize_std):
    gen = torch.Generator().manual_seed(0)
    groups = [_group(torch.randint(0, 3, (4,), generator=gen).float().tolist(), i)
              for i in range(12)]
    groups.append(_group([0.5, 0.5, 0.5, 0.5], 12))  # no signal: dropped by both
    old = old_build_batch(groups, normalize_std=normalize_std)
    new = _algo("grpo", normalize_std=normalize_std).build_batch(groups)
    assert new.num_dropped_groups == old.num_dropped_groups >= 1
    assert [g.index for g in new.groups] == [g.index for g in old.groups]
    assert new.advantages_G == old.advantages_G  # exactly: the same float64 arithmetic


def test_grpo_hand_values_and_one_sample_groups():
    batch = _algo("grpo", normalize_std=True).build_batch([_group([1.0, 0.0, 0.0, 1.0]),
                                                           _group([3.0], 1)])
    assert batch.advantages_G == [pytest.approx([1, -1, -1, 1], abs=1e-5)]
    assert batch.num_dropped_groups == 1  # one sample: all-equal, no signal


def test_dr_grpo_never_divides_by_std_and_divides_by_a_constant():
    a = _algo("dr_grpo", max_new_tokens=5)
    batch = a.build_batch([_group([2.0, 0.0, 1.0], lengths=[1, 3, 5])])
    assert batch.advantages_G == [[1.0, -1.0, 0.0]]
    assert a.denominator(batch) == 3 * 5  # samples x max_new_tokens, not 9 tokens
    assert _algo("grpo").denominator(batch) == 9


def test_rloo_leave_one_out_baseline():
    batch = _algo("rloo").build_batch([_group([1.0, 0.0, 0.0, 2.0]), _group([1.0], 1),
                                       _group([0.0, 0.0], 2)])
    # r_i - mean of the others: 1 - 2/3, 0 - 1, 0 - 1, 2 - 1/3
    assert batch.advantages_G == [pytest.approx([1 / 3, -1.0, -1.0, 5 / 3])]
    assert batch.num_dropped_groups == 2  # one sample (no baseline), all equal
    assert registry.get("rloo")().group_advantages(torch.tensor([4.0])).tolist() == [0.0]


def test_reinforce_pp_token_weighted_batch_normalisation_keeps_equal_groups():
    batch = _algo("reinforce_pp").build_batch([_group([1.0, 1.0], lengths=[1, 3]),
                                               _group([0.0, 2.0], 1, lengths=[2, 2])])
    assert batch.num_dropped_groups == 0  # no per-prompt baseline: every group kept
    # per token: rewards 1 x1, 1 x3, 0 x2, 2 x2 over 8 tokens: mean 1, var 4/8, std sqrt(.5)
    s = 0.5 ** 0.5
    assert batch.advantages_G[0] == pytest.approx([0.0, 0.0], abs=1e-6)
    assert batch.advantages_G[1] == pytest.approx([-1 / s, 1 / s], rel=1e-5)


def test_dapo_soft_overlong_penalty_by_hand():
    a = _algo("dapo", max_new_tokens=10, overlong_buffer=4, overlong_penalty=1.0)
    r = [a.shaped_reward(_group([1.0], lengths=[n]).samples[0]) for n in (5, 6, 7, 8, 10)]
    # L=10, C=4: no penalty up to 6, then (6 - n) / 4
    assert r == pytest.approx([1.0, 1.0, 0.75, 0.5, 0.0])
    assert _algo("dapo", max_new_tokens=20).knobs.overlong_buffer == 4  # default L // 5
    assert _algo("grpo", max_new_tokens=10).shaped_reward(
        _group([1.0], lengths=[10]).samples[0]) == 1.0  # off by default elsewhere


def test_overlong_filter_removes_truncated_samples_after_their_advantages():
    a = _algo("dapo", overlong_filter=True, overlong_buffer=0)
    groups = [_group([1.0, 0.0, 0.0, 1.0], 0, finish=["stop", "length", "stop", "stop"]),
              _group([1.0, 0.0], 1, finish=["length", "length"])]
    batch = a.build_batch(groups)
    assert [len(g.samples) for g in batch.groups] == [3]
    assert batch.advantages_G == [[0.5, -0.5, 0.5]]  # the group's mean still had all four
    assert batch.num_dropped_groups == 1  # the group left empty


@pytest.mark.parametrize("name", ["grpo", "dapo", "gspo", "rloo"])
def test_a_sample_with_no_completion_tokens_counts_in_its_group_then_leaves(name):
    """A model that stopped at once (a plain OpenAI server reports no stop token): its reward
    counts in its group's advantages, but it has no tokens to train on, so it leaves the
    batch; a group left empty is dropped and counted."""
    a = _algo(name)
    full = a.build_batch([_group([1.0, 0.0, 0.0, 1.0], 0)])
    groups = [_group([1.0, 0.0, 0.0, 1.0], 0, lengths=[1, 0, 1, 1]),
              _group([1.0, 0.0], 1, lengths=[0, 0])]
    batch = a.build_batch(groups)
    assert [len(g.samples) for g in batch.groups] == [3]
    assert all(s.completion_ids for g in batch.groups for s in g.samples)
    want = full.advantages_G[0]
    assert batch.advantages_G == [[want[0], want[2], want[3]]]
    assert batch.num_dropped_groups == 1


def test_knobs_take_the_algorithm_defaults_then_the_users():
    from traingym.algorithms.config import AlgorithmConfig

    assert registry.get("gspo").resolve(AlgorithmConfig(name="gspo")).clip_high == 4e-4
    k = registry.get("gspo").resolve(AlgorithmConfig(name="gspo", clip_high=0.5))
    assert (k.clip_low, k.clip_high) == (3e-4, 0.5)
    assert registry.get("dapo").resolve(AlgorithmConfig(name="dapo")).dynamic_sampling
    assert Knobs() == registry.get("grpo").resolve(None)
