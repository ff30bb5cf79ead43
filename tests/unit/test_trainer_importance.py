"""The trainer reads the engine's log-probs from each Sample and weights the policy gradient:
engine log-probs equal to the trainer's give exactly the uncorrected update; under mis, a
sample whose engine log-probs are far below the trainer's (ratio over the cap) contributes
nothing, so the update equals training without it. The step's mismatch stats come from the trainer's
log-probs before its update: 0 for matching engine log-probs, the hand-computed |d| and k3 for
shifted ones, environment tokens excluded."""

import copy
import math

import torch

from traingym.algorithms.importance import ImportanceSpec
from traingym.trainer.config import TrainerConfig
from traingym.models.loader import tiny_model, tiny_tokenizer
from traingym.trainer.logprobs import completion_logprobs
from traingym.trainer.torch_trainer import TorchTrainer
from traingym.core.types import Batch, Group, Sample

CFG = TrainerConfig(lr=1e-2, bf16_autocast=False, grad_clip=1e9)
PROMPT = (5, 6, 7, 8)
COMPS = [[20, 21, 22], [23, 24], [25, 26, 27], [28]]
ADV = [1.0, -0.5, 0.25, -0.75]


def _batch(model, engine_shift: list[float], masks=None) -> Batch:
    masks = masks or [[1] * len(c) for c in COMPS]
    with torch.no_grad():
        lp = completion_logprobs(model, [PROMPT], [COMPS], 1.0, 0).logp_B_T
    samples = [Sample(PROMPT, c, [float(x) - engine_shift[i] if m else 0.0
                                  for x, m in zip(lp[i, : len(c)], masks[i])],
                      [0] * len(c), {}, loss_mask=masks[i]) for i, c in enumerate(COMPS)]
    return Batch([Group(samples, 0)], [ADV])


def _step(model, batch, importance, stats=None):
    m = copy.deepcopy(model)
    out = TorchTrainer(m, CFG, 1.0, 0, importance=importance).train_step(batch)
    if stats is not None:
        stats.update(out)
    return torch.cat([p.detach().flatten() for p in m.parameters()])


def test_matching_engine_logprobs_leave_the_update_unchanged():
    model = tiny_model(tiny_tokenizer(), seed=1)
    batch = _batch(model, [0.0] * 4)
    plain = _step(model, batch, None)
    for mode in ("tis", "mis"):
        for level in ("token", "sequence"):
            imp = ImportanceSpec(mode, level, 2.0)
            assert torch.allclose(_step(model, batch, imp), plain, atol=1e-6), (mode, level)


def test_mis_drops_a_sample_whose_ratio_passes_the_cap():
    model = tiny_model(tiny_tokenizer(), seed=1)
    far = _batch(model, [0.0, 5.0, 0.0, 0.0])  # sample 1: engine log-probs 5 nats lower
    imp = ImportanceSpec("mis", "token", 2.0)
    masked = _step(model, far, imp)
    without = _batch(model, [0.0] * 4)
    without.advantages_G = [[1.0, 0.0, 0.25, -0.75]]  # the same sample with no gradient
    assert torch.allclose(masked, _step(model, without, None), atol=1e-6)
    assert not torch.allclose(masked, _step(model, far, None), atol=1e-6)


def test_step_reports_the_mismatch_before_its_update():
    model = tiny_model(tiny_tokenizer(), seed=1)
    same: dict = {}
    _step(model, _batch(model, [0.0] * 4), None, same)
    # same model, same function, no update yet: equal up to float rounding
    assert same["mismatch_abs_logp"] < 1e-6 and 0.0 <= same["mismatch_kl_k3"] < 1e-10
    shifted: dict = {}
    _step(model, _batch(model, [0.0, 0.5, 0.0, -0.25]), None, shifted)
    # 9 policy tokens; sample 1 (2 tokens) d = +0.5, sample 3 (1 token) d = -0.25
    assert math.isclose(shifted["mismatch_abs_logp"], (2 * 0.5 + 0.25) / 9, rel_tol=1e-4)
    k3 = (2 * (math.expm1(0.5) - 0.5) + (math.expm1(-0.25) + 0.25)) / 9
    assert math.isclose(shifted["mismatch_kl_k3"], k3, rel_tol=1e-4)
    assert "is_weight_mean" not in shifted  # no correction, no importance stats


def test_env_tokens_do_not_count_and_tis_reports_its_stats():
    model = tiny_model(tiny_tokenizer(), seed=1)
    masks = [[1, 0, 1], [1, 1], [1, 0, 0], [1]]  # env tokens carry engine log-prob 0.0
    stats: dict = {}
    tis = ImportanceSpec("tis", "token", 2.0)
    _step(model, _batch(model, [0.0, 1.0, 0.0, 0.0], masks), tis, stats)
    # 6 policy tokens; sample 1's two have d = 1.0 (ratio e > cap 2: truncated to 2)
    assert math.isclose(stats["mismatch_abs_logp"], 2.0 / 6, rel_tol=1e-4)
    assert math.isclose(stats["mismatch_kl_k3"], 2 * (math.expm1(1.0) - 1.0) / 6, rel_tol=1e-4)
    assert math.isclose(stats["is_capped_frac"], 2 / 6, rel_tol=1e-6)
    assert math.isclose(stats["is_weight_mean"], (4 * 1.0 + 2 * 2.0) / 6, rel_tol=1e-4)
    assert stats["is_zero_frac"] == 0.0 and stats["trained_tokens"] == 6
