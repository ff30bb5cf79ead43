"""The trainer reads the engine's log-probs from each Sample and weights the policy gradient:
engine log-probs equal to the trainer's give exactly the uncorrected update; under mis, a
sample whose engine log-probs are far below the trainer's (ratio over the cap) contributes
nothing, so the update equals training without it."""

import copy

import torch

from traingym.config import AsyncConfig, TrainerConfig
from traingym.models.loader import tiny_model, tiny_tokenizer
from traingym.trainer.logprobs import completion_logprobs
from traingym.trainer.torch_trainer import TorchTrainer
from traingym.types import Batch, Group, Sample

CFG = TrainerConfig(lr=1e-2, bf16_autocast=False, grad_clip=1e9)
PROMPT = (5, 6, 7, 8)
COMPS = [[20, 21, 22], [23, 24], [25, 26, 27], [28]]
ADV = [1.0, -0.5, 0.25, -0.75]


def _batch(model, engine_shift: list[float]) -> Batch:
    with torch.no_grad():
        lp = completion_logprobs(model, [PROMPT], [COMPS], 1.0, 0).logp_B_T
    samples = [Sample(PROMPT, c, [float(x) - engine_shift[i] for x in lp[i, : len(c)]],
                      [0] * len(c), {}) for i, c in enumerate(COMPS)]
    return Batch([Group(samples, 0)], [ADV])


def _step(model, batch, importance):
    m = copy.deepcopy(model)
    TorchTrainer(m, CFG, 1.0, 0, importance=importance).train_step(batch)
    return torch.cat([p.detach().flatten() for p in m.parameters()])


def test_matching_engine_logprobs_leave_the_update_unchanged():
    model = tiny_model(tiny_tokenizer(), seed=1)
    batch = _batch(model, [0.0] * 4)
    plain = _step(model, batch, None)
    for mode in ("tis", "mis"):
        for level in ("token", "sequence"):
            imp = AsyncConfig(is_correction=mode, is_level=level, is_cap=2.0)
            assert torch.allclose(_step(model, batch, imp), plain, atol=1e-6), (mode, level)


def test_mis_drops_a_sample_whose_ratio_passes_the_cap():
    model = tiny_model(tiny_tokenizer(), seed=1)
    far = _batch(model, [0.0, 5.0, 0.0, 0.0])  # sample 1: engine log-probs 5 nats lower
    imp = AsyncConfig(is_correction="mis", is_level="token", is_cap=2.0)
    masked = _step(model, far, imp)
    without = _batch(model, [0.0] * 4)
    without.advantages_G = [[1.0, 0.0, 0.25, -0.75]]  # the same sample with no gradient
    assert torch.allclose(masked, _step(model, without, None), atol=1e-6)
    assert not torch.allclose(masked, _step(model, far, None), atol=1e-6)
