"""Importance-sampling weights token by token: tis and mis, token and sequence level, the
mask, and the weight entering the loss without a gradient; the tokens over the cap; the
mismatch sums (|d| and k3) against hand-computed values; the correction's config in the
trainer section ('auto' by mode) and the moved async.* keys' error."""

import math

import pytest
import torch

import traingym
from traingym.algorithms.importance import (ImportanceSpec, importance_sums, importance_weights,
                                            mismatch_sums, over_cap)
from traingym.core.errors import ConfigError
from traingym.algorithms.losses import grpo_token_loss

# Two samples, three token slots; the second sample has a padded (masked) last slot.
TRAINER = torch.tensor([[-1.0, -2.0, -0.5], [-1.0, -3.0, 0.0]])
ENGINE = torch.tensor([[-1.5, -1.0, -0.5], [-2.0, -3.2, -9.0]])
MASK = torch.tensor([[1, 1, 1], [1, 1, 0]])
# log ratios: [[0.5, -1.0, 0.0], [1.0, 0.2, (masked)]]


def _w(mode, level, cap=2.0):
    return importance_weights(TRAINER, ENGINE, MASK, mode, level, cap)


def test_tis_token_truncates_each_token():
    e = math.exp
    expected = torch.tensor([[e(0.5), e(-1.0), 1.0], [2.0, e(0.2), 0.0]])  # e(1.0) > 2 -> 2
    assert torch.allclose(_w("tis", "token"), expected)


def test_mis_token_zeroes_tokens_over_the_cap():
    e = math.exp
    expected = torch.tensor([[e(0.5), e(-1.0), 1.0], [0.0, e(0.2), 0.0]])
    assert torch.allclose(_w("mis", "token"), expected)


def test_sequence_level_shares_one_product_weight():
    # sequence log ratios: 0.5 - 1.0 + 0.0 = -0.5; 1.0 + 0.2 = 1.2 (exp 3.32 > cap 2)
    tis = _w("tis", "sequence")
    assert torch.allclose(tis, torch.tensor([[math.exp(-0.5)] * 3, [2.0, 2.0, 0.0]]))
    mis = _w("mis", "sequence")
    assert torch.allclose(mis, torch.tensor([[math.exp(-0.5)] * 3, [0.0, 0.0, 0.0]]))
    loose = _w("mis", "sequence", cap=4.0)
    assert torch.allclose(loose, torch.tensor([[math.exp(-0.5)] * 3, [math.exp(1.2)] * 2 + [0.0]]))


def test_huge_sequence_ratio_does_not_overflow():
    t = torch.zeros(1, 200)
    e = torch.full((1, 200), -50.0)  # log ratio 50 per token: exp(10000) overflows
    m = torch.ones(1, 200)
    tis = importance_weights(t, e, m, "tis", "sequence", 2.0)
    assert torch.equal(tis, torch.full((1, 200), 2.0))
    assert torch.equal(importance_weights(t, e, m, "mis", "sequence", 2.0), torch.zeros(1, 200))


def test_none_is_the_mask_and_bad_names_fail():
    assert torch.equal(_w("none", "token"), MASK.float())
    with pytest.raises(ValueError, match="mode"):
        _w("clip", "token")
    with pytest.raises(ValueError, match="level"):
        _w("tis", "batch")


def test_sums_count_policy_tokens_only():
    w = _w("mis", "token")
    sums = importance_sums(w, MASK)
    assert sums["is_zero_frac"] == 1.0  # one policy token zeroed; the padded slot not counted
    assert math.isclose(sums["is_weight_mean"], float(w.sum()), rel_tol=1e-6)


def test_weight_scales_the_policy_gradient_without_a_gradient_of_its_own():
    logp = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    adv = torch.tensor([1.0])
    w = torch.tensor([[0.5, 0.0]], requires_grad=True)
    loss, _, _ = grpo_token_loss(logp, logp.detach(), adv, 0.2, 0.28, is_weight_B_T=w)
    loss.sum().backward()
    # d(-ratio * A * w)/dlogp at ratio 1 = -A * w
    assert torch.allclose(logp.grad, torch.tensor([[-0.5, 0.0]]))
    assert w.grad is None


def test_over_cap_marks_truncated_or_masked_policy_tokens():
    # token log ratios [[0.5, -1.0, 0.0], [1.0, 0.2, (masked)]]: only 1.0 > log 2 = 0.693
    assert torch.equal(over_cap(TRAINER, ENGINE, MASK, "token", 2.0),
                       torch.tensor([[False, False, False], [True, False, False]]))
    # sequence: -0.5 and 1.2; the second sample's two policy tokens, not its padded slot
    assert torch.equal(over_cap(TRAINER, ENGINE, MASK, "sequence", 2.0),
                       torch.tensor([[False, False, False], [True, True, False]]))
    sums = importance_sums(_w("tis", "token"), MASK,
                           over_cap(TRAINER, ENGINE, MASK, "token", 2.0))
    assert sums["is_capped_frac"] == 1.0 and sums["is_zero_frac"] == 0.0


def _k3(d):
    return math.expm1(d) - d


def test_mismatch_sums_by_hand():
    # policy-token differences d = trainer - engine: 0.5, -1.0, 0.0, 1.0, 0.2 (the masked slot,
    # d = 9.0, must not count)
    sums = mismatch_sums(TRAINER, ENGINE, MASK)
    assert math.isclose(sums["mismatch_abs_logp"], 0.5 + 1.0 + 0.0 + 1.0 + 0.2, rel_tol=1e-6)
    want = sum(_k3(d) for d in (0.5, -1.0, 0.0, 1.0, 0.2))
    assert math.isclose(sums["mismatch_kl_k3"], want, rel_tol=1e-6)
    assert want > 0  # k3 >= 0 for every d, 0 only at d = 0


def test_mismatch_of_equal_logprobs_is_exactly_zero():
    sums = mismatch_sums(TRAINER, TRAINER.clone(), MASK)
    assert sums == {"mismatch_abs_logp": 0.0, "mismatch_kl_k3": 0.0}


def test_mismatch_skips_environment_tokens():
    # a multi-turn row: policy, env, env, policy; env tokens carry engine log-prob 0.0 and a
    # trainer log-prob far from it, and must count for nothing
    trainer = torch.tensor([[-0.3, -4.0, -6.0, -1.0]])
    engine = torch.tensor([[-0.2, 0.0, 0.0, -1.0]])
    mask = torch.tensor([[1, 0, 0, 1]])
    sums = mismatch_sums(trainer, engine, mask)
    assert math.isclose(sums["mismatch_abs_logp"], 0.1, rel_tol=1e-6)
    assert math.isclose(sums["mismatch_kl_k3"], _k3(-0.1), rel_tol=1e-5)


def test_k3_is_accurate_for_tiny_differences():
    # k3 ~ d^2 / 2: 5e-13 at d = 1e-6, where (r - 1) - log r in float32 would be rounding noise
    d = 1e-6
    sums = mismatch_sums(torch.tensor([[-1.0 + d]], dtype=torch.float64),
                         torch.tensor([[-1.0]], dtype=torch.float64), torch.ones(1, 1))
    assert math.isclose(sums["mismatch_kl_k3"], d * d / 2, rel_tol=1e-3)


def test_is_correction_lives_in_the_algorithm_section():
    sync = traingym.build_config("tiny")
    asyn = traingym.build_config("tiny", overrides={"mode": "async",
                                                    "weights": {"transport": "tcp"}})
    assert ImportanceSpec.from_section(sync.algorithm, sync.mode) == ImportanceSpec("none", "token", 2.0)
    assert ImportanceSpec.from_section(asyn.algorithm, asyn.mode) == ImportanceSpec("tis", "token", 2.0)
    on = traingym.build_config("tiny", overrides={"algorithm": {
        "is_correction": "mis", "is_level": "sequence", "is_cap": 3.0}})
    assert ImportanceSpec.from_section(on.algorithm, on.mode) == ImportanceSpec("mis", "sequence", 3.0)
    with pytest.raises(ConfigError, match="apply only with an importance correction"):
        traingym.build_config("tiny", overrides={"algorithm": {"is_cap": 3.0}})


@pytest.mark.parametrize("key", ["is_correction", "is_level", "is_cap"])
def test_old_async_keys_name_their_new_place(key):
    value = {"is_correction": "tis", "is_level": "token", "is_cap": 2.0}[key]
    with pytest.raises(ConfigError, match=f"'async.{key}' has moved to 'algorithm.{key}'"):
        traingym.build_config("tiny", overrides={"mode": "async", "weights": {
            "transport": "tcp"}, "async": {key: value}})
    with pytest.raises(ConfigError, match=f"'trainer.{key}' has moved to 'algorithm.{key}'"):
        traingym.build_config("tiny", overrides={"trainer": {key: value}})
