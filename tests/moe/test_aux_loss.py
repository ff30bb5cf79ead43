"""The load-balancing auxiliary loss (algorithm.moe_aux_loss_coef, trainer/moe_aux.py) on tiny
random-init MoE models (tests/moe_tiny.py), samples from the built-in engine:

- coef 0 (the default, or set explicitly) leaves the loss and every gradient bitwise equal;
- with coef > 0 and zero advantages (the policy loss then has zero gradient) the reported
  moe_aux_loss equals transformers' own `load_balancing_loss_func` over the router logits of a
  plain HF forward of each sample's prompt + completion[:-1], masked to the positions that
  predict policy tokens (the last prompt position and every completion position whose next
  token has loss_mask 1; some loss-mask entries are zeroed here), and the gradients equal
  coef x that loss's gradient, to fp32 rounding; over several micro-batches it is their
  token-weighted mean;
- a short `traingym train` run with coef > 0 trains and logs moe_aux_loss (Qwen3-MoE, and
  Qwen2-MoE with routing replay: its sync run's route mismatch is 0), also with two
  data-parallel ranks;
- a dense model is refused when the config is built (and by the trainer), and so is gradient
  checkpointing.
"""

from __future__ import annotations

import copy
import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from moe_tiny import save_tiny_moe, tiny_moe  # tests/ is on sys.path (tests/conftest.py)

import traingym
from traingym.core.errors import ConfigError
from traingym.core.types import Batch
from traingym.loop.trainer import build_trainer
from traingym.observability.events import read_events
from traingym.observability.schema import check_step
from traingym.rollout.torch_engine import TorchEngine

from test_replay import _batch  # noqa: E402  (tests/moe is on sys.path under pytest)

FAMILIES = ("qwen3_moe", "mixtral", "qwen2_moe")


def _trainer(model, tok, coef=None, **trainer):
    cfg = traingym.build_config("tiny", overrides={
        "trainer": {"lr": 1e-3, "micro_batch_groups": 8, **trainer}})
    if coef is not None:  # set after the config's rules ("tiny" is dense; the model is not)
        cfg.algorithm.moe_aux_loss_coef = coef
    return build_trainer(cfg, copy.deepcopy(model), tok.pad_token_id)


def _grads(trainer, batch):
    total = sum(sum(s.loss_mask) for g in batch.groups for s in g.samples)
    trainer.optimizer.zero_grad(set_to_none=True)
    stats = trainer.accumulate(batch.groups, batch.advantages_G, total,
                               denom=trainer.algorithm.denominator(batch))
    return stats, {n: p.grad.clone() for n, p in trainer.model.named_parameters()
                   if p.grad is not None}


def _masked(batch):
    """Some policy tokens turned into environment tokens (loss_mask 0), the first token of one
    sample among them, so the mask's effect is tested."""
    g0 = batch.groups[0].samples
    g0[0].loss_mask = [0] + list(g0[0].loss_mask[1:])
    g0[1].loss_mask = [m if i % 3 else 0 for i, m in enumerate(g0[1].loss_mask)]
    return batch


def hf_aux_loss(model, groups):
    """transformers' load_balancing_loss_func over a plain HF forward of each sample's prompt +
    completion[:-1] (right-padded), weighted 1 at each position predicting a policy token."""
    seqs, weights = [], []
    for g in groups:
        for s in g.samples:
            p = list(s.prompt_ids)
            seqs.append(p + list(s.completion_ids[:-1]))
            w = [0.0] * len(seqs[-1])
            for j, m in enumerate(s.loss_mask):
                w[len(p) - 1 + j] = float(m)
            weights.append(w)
    L = max(map(len, seqs))
    ids = torch.tensor([s + [0] * (L - len(s)) for s in seqs])
    attn = torch.tensor([[1] * len(s) + [0] * (L - len(s)) for s in seqs])
    mask = torch.tensor([w + [0.0] * (L - len(w)) for w in weights])
    out = model(input_ids=ids, attention_mask=attn, output_router_logits=True, use_cache=False)
    mt = model.config.model_type
    fn = importlib.import_module(f"transformers.models.{mt}.modeling_{mt}").load_balancing_loss_func
    k = model.config.num_experts_per_tok
    E = getattr(model.config, "num_experts", None) or model.config.num_local_experts
    # the model's own aux_loss is the same function over its attention mask
    torch.testing.assert_close(out.aux_loss, fn(out.router_logits, E, k, attn))
    return fn(out.router_logits, E, k, mask)


@pytest.mark.parametrize("family", ["qwen3_moe", "mixtral"])
def test_coef_zero_is_bitwise_unchanged(family):
    model, tok = tiny_moe(family)
    batch = _batch(TorchEngine(copy.deepcopy(model), tok.pad_token_id), tok)
    s0, g0 = _grads(_trainer(model, tok), batch)
    s1, g1 = _grads(_trainer(model, tok, coef=0.0), batch)
    assert "moe_aux_loss" not in s0 and "moe_aux_loss" not in s1
    assert s0 == s1
    assert g0.keys() == g1.keys() and all(torch.equal(g0[n], g1[n]) for n in g0)
    s2, g2 = _grads(_trainer(model, tok, coef=0.1), batch)  # and > 0 changes them
    assert s2["loss"] == s0["loss"] and s2["moe_aux_loss"] > 0
    assert any(not torch.equal(g0[n], g2[n]) for n in g0)


@pytest.mark.parametrize("family", FAMILIES)
def test_added_term_is_transformers_aux_loss_over_the_trained_positions(family):
    coef = 0.3
    model, tok = tiny_moe(family)
    batch = _masked(_batch(TorchEngine(copy.deepcopy(model), tok.pad_token_id), tok))
    zero = Batch(batch.groups, [[0.0] * len(a) for a in batch.advantages_G])
    stats, grads = _grads(_trainer(model, tok, coef=coef), zero)
    ref = copy.deepcopy(model).train()
    want = hf_aux_loss(ref, batch.groups)
    (coef * want).backward()
    want = float(want.detach())
    assert abs(stats["moe_aux_loss"] - want) < 1e-5 * want, (stats, want)
    compared = 0
    for n, p in ref.named_parameters():
        if p.grad is None or not p.grad.abs().max() > 0:
            assert n not in grads or not grads[n].abs().max() > 0, n
            continue
        # fp32 rounding of two attention kernels' sums (the trainer runs short rows on SDPA's
        # math kernel, the reference HF forward torch's choice): bounded by the tensor's scale
        scale = float(p.grad.abs().max())
        torch.testing.assert_close(grads[n], p.grad, rtol=1e-4, atol=4e-6 * scale, msg=n)
        compared += 1
    assert compared >= 10  # the routers and everything below them
    # the trainer's own mask counts the same positions: a mask of all real tokens differs
    assert abs(stats["moe_aux_loss"] - float(hf_aux_loss_all(ref, batch.groups))) > 1e-6


def hf_aux_loss_all(model, groups):
    """HF's own aux_loss over every position of prompt + completion[:-1] (its attention
    mask): not the positions the trainer counts."""
    seqs = [list(s.prompt_ids) + list(s.completion_ids[:-1]) for g in groups for s in g.samples]
    L = max(map(len, seqs))
    ids = torch.tensor([s + [0] * (L - len(s)) for s in seqs])
    attn = torch.tensor([[1] * len(s) + [0] * (L - len(s)) for s in seqs])
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=attn, output_router_logits=True,
                     use_cache=False).aux_loss


def test_micro_batches_give_the_token_weighted_mean():
    model, tok = tiny_moe("qwen3_moe")
    batch = _masked(_batch(TorchEngine(copy.deepcopy(model), tok.pad_token_id), tok))
    stats, _ = _grads(_trainer(model, tok, coef=0.1, micro_batch_groups=1), batch)
    tokens = [sum(sum(s.loss_mask) for s in g.samples) for g in batch.groups]
    with torch.no_grad():
        parts = [float(hf_aux_loss(model, [g])) for g in batch.groups]
    want = sum(p * n for p, n in zip(parts, tokens)) / sum(tokens)
    assert abs(stats["moe_aux_loss"] - want) < 1e-5 * want


@pytest.mark.parametrize("family", ["qwen3_moe", "qwen2_moe"])
def test_cli_train_run_with_aux_loss_logs_it(family, tmp_path):
    """Qwen2-MoE also with routing replay: its sync run replays and its mismatch is 0."""
    path = save_tiny_moe(tmp_path / "model", family)
    src = str(Path(traingym.__file__).resolve().parents[1])  # this checkout's traingym
    sets = [f"model.path={path}", "algorithm.moe_aux_loss_coef=0.01", "steps=3",
            "eval.before=false", "eval.after=false", "algorithm.routing_replay=true"]
    p = subprocess.run([sys.executable, "-m", "traingym.cli", "train", "--preset", "tiny",
                        *[a for s in sets for a in ("--set", s)], "--run-dir",
                        str(tmp_path / "run")], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "PYTHONPATH": src})
    assert p.returncode == 0, p.stderr
    events = read_events(tmp_path / "run")
    trained = [e for e in events if e["trained_tokens"]]
    assert [e["step"] for e in events] == [1, 2, 3] and trained
    for e in trained:
        assert check_step(e) == [], check_step(e)
        assert 1.0 < e["moe_aux_loss"] <= 8.0, e  # k = 2 when balanced, at most E = 8
        assert e["moe_route_mismatch"] == 0.0 and e["mismatch_abs_logp"] < 1e-4, e


def test_dense_model_and_gradient_checkpointing_are_refused(tmp_path):
    with pytest.raises(ConfigError, match=r"moe_aux_loss_coef > 0 .*dense model .*'llama'.*"
                                          r"set algorithm.moe_aux_loss_coef = 0"):
        traingym.build_config("tiny", overrides={"algorithm": {"moe_aux_loss_coef": 0.01}})
    from traingym.models.loader import load_policy

    model, tok = load_policy("tiny")  # a model the config could not see: the trainer refuses
    with pytest.raises(ConfigError, match="needs a mixture-of-experts model"):
        _trainer(model, tok, coef=0.01)
    path = save_tiny_moe(tmp_path / "model", "mixtral")
    with pytest.raises(ConfigError, match="gradient_checkpointing"):
        traingym.build_config("tiny", overrides={
            "model": {"path": path}, "algorithm": {"moe_aux_loss_coef": 0.01},
            "trainer": {"gradient_checkpointing": True}})
    cfg = traingym.build_config("tiny", overrides={  # an MoE folder passes
        "model": {"path": path}, "algorithm": {"moe_aux_loss_coef": 0.01}})
    assert cfg.algorithm.moe_aux_loss_coef == 0.01


def test_aux_loss_with_data_parallel_ranks(tmp_path):
    """Each rank adds its micro-batches' shares of the batch's policy tokens; the step's
    moe_aux_loss is their sum (trainer/distributed.py adds the ranks' stats)."""
    path = save_tiny_moe(tmp_path / "model", "mixtral")
    cfg = traingym.build_config("tiny", overrides={
        "steps": 2, "threads": 1, "model": {"path": path},
        "eval": {"before": False, "after": False},
        "algorithm": {"moe_aux_loss_coef": 0.01}, "trainer": {"data_parallel": 2}})
    traingym.train(cfg, run_dir=tmp_path / "run", progress=False)
    trained = [e for e in read_events(tmp_path / "run") if e["trained_tokens"]]
    assert trained
    for e in trained:
        assert check_step(e) == [], check_step(e)
        # E x sum_e f_e P_e (f_e <= 1, sum_e f_e = k, sum_e P_e = 1): k = 2 when balanced,
        # at most E = 8
        assert 1.0 < e["moe_aux_loss"] <= 8.0, e
