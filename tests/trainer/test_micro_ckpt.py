"""Micro-batching by tokens and gradient checkpointing give the update of one big batch."""

import copy
import random

import torch

from traingym.trainer.config import TrainerConfig
from traingym.models.loader import tiny_model, tiny_tokenizer
from traingym.trainer.micro import micro_batches, pass_tokens
from traingym.trainer.torch_trainer import TorchTrainer
from traingym.core.types import Batch, Group, Sample


def _batch(seed=0, groups=5, G=4):
    rng = random.Random(seed)
    out, adv = [], []
    for gi in range(groups):
        prompt = tuple(rng.randrange(3, 300) for _ in range(rng.randint(2, 9)))
        samples = []
        for _ in range(G):
            n = rng.randint(1, 7)
            samples.append(Sample(prompt, [rng.randrange(3, 300) for _ in range(n)],
                                  [-1.0] * n, [0] * n, {}))
        out.append(Group(samples, gi))
        adv.append([rng.uniform(-1, 1) for _ in range(G)])
    return Batch(out, adv)


def _step(cfg_kwargs, batch, seed=3):
    tok = tiny_tokenizer()
    model = tiny_model(tok, seed=seed).double()
    cfg = TrainerConfig(lr=1e-2, bf16_autocast=False, **cfg_kwargs)
    trainer = TorchTrainer(model, cfg, 1.0, tok.pad_token_id)
    trainer.optimizer.zero_grad(set_to_none=True)
    from traingym.trainer.torch_trainer import batch_tokens

    stats = trainer.accumulate(batch.groups, batch.advantages_G, batch_tokens(batch))
    grads = [p.grad.clone() for p in model.parameters()]
    return stats, grads


def test_micro_batches_respect_the_cap_and_keep_every_sample_once():
    batch = _batch()
    passes = micro_batches(batch.groups, batch.advantages_G, 4, max_tokens=30)
    assert len(passes) > 2
    seen = []
    for groups, adv in passes:
        many = sum(len(g.samples) for g in groups) > 1
        assert pass_tokens(groups) <= 30 or not many  # only a lone sample may pass the cap
        for g, a in zip(groups, adv):
            assert len(g.samples) == len(a)
            seen += [(g.index, id(s), x) for s, x in zip(g.samples, a)]
    expected = [(g.index, id(s), x) for g, adv in zip(batch.groups, batch.advantages_G)
                for s, x in zip(g.samples, adv)]
    assert seen == expected
    # without a cap: whole groups
    whole = micro_batches(batch.groups, batch.advantages_G, 2)
    assert [len(g) for g, _ in whole] == [2, 2, 1]


def test_token_micro_batches_give_the_big_batch_update():
    batch = _batch(seed=1)
    big_stats, big = _step({"micro_batch_groups": 100}, batch)
    small_stats, small = _step({"micro_batch_tokens": 25}, batch)
    assert len(micro_batches(batch.groups, batch.advantages_G, 4, 25)) >= 4
    for a, b in zip(big, small):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-8), (a - b).abs().max()
    assert abs(big_stats["loss"] - small_stats["loss"]) < 1e-9
    assert abs(big_stats["entropy"] - small_stats["entropy"]) < 1e-9


def test_gradient_checkpointing_gives_the_same_loss_and_grads():
    batch = _batch(seed=2)
    plain_stats, plain = _step({}, batch)
    ckpt_stats, ckpt = _step({"gradient_checkpointing": True}, batch)
    assert abs(plain_stats["loss"] - ckpt_stats["loss"]) < 1e-9
    # the checkpointed path runs full rows (micro.py); HF's RMSNorm computes in float32
    for a, b in zip(plain, ckpt):
        assert torch.allclose(a, b, rtol=1e-5, atol=2e-6), (a - b).abs().max()
    assert any(float(g.abs().sum()) > 0 for g in ckpt)


def test_checkpointing_is_on_in_the_layers():
    tok = tiny_tokenizer()
    model = tiny_model(tok)
    trainer = TorchTrainer(model, TrainerConfig(gradient_checkpointing=True,
                                                bf16_autocast=False), 1.0, tok.pad_token_id)
    assert all(layer.gradient_checkpointing for layer in model.model.layers)
    assert trainer.logprobs.__name__ == "sequence_logprobs"
