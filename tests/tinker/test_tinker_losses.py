"""forward_backward's loss and gradients equal traingym's own loss code on the same data (to
fp32 rounding), for every loss the server takes: the SDK sends the request, the test reads the
server's gradients and recomputes them with algorithms/losses.py and algorithms/cispo.py over
the same model."""

import numpy as np
import pytest
import torch
from conftest import datum

from traingym.algorithms.base import Knobs
from traingym.algorithms.cispo import CISPO
from traingym.algorithms.losses import clipped_surrogate
from traingym.core.padding import right_pad
from traingym.models.scoring import token_logprobs

CONFIG = {"cross_entropy": None, "importance_sampling": None,
          "ppo": {"clip_low_threshold": 0.9, "clip_high_threshold": 1.1},
          "cispo": {"clip_low_threshold": 0.95, "clip_high_threshold": 1.05}}


def reference(model, rows, inputs, loss_fn, config):
    """The summed loss over the datums, with traingym's loss functions."""
    ids, mask = right_pad([r[:-1] for r in rows], 0)
    tgt, _ = right_pad([r[1:] for r in rows], 0)
    logp = token_logprobs(model(input_ids=ids, attention_mask=mask, use_cache=False)
                          .logits.float(), tgt, 1.0)
    total = 0.0
    for b, inp in enumerate(inputs):
        n = len(rows[b]) - 1
        lp = logp[b, :n][None]  # (1, T)
        if loss_fn == "cross_entropy":
            per = -lp * torch.tensor(inp["weights"])[None]
        else:
            old, adv = torch.tensor(inp["logprobs"])[None], torch.tensor(inp["advantages"])[None]
            low = (config or {}).get("clip_low_threshold", 0.8)
            high = (config or {}).get("clip_high_threshold", 1.2)
            if loss_fn == "importance_sampling":  # PPO's surrogate with no clipping
                per = clipped_surrogate(lp, old, adv, 1e9, 1e9)[0]
            elif loss_fn == "ppo":
                per = clipped_surrogate(lp, old, adv, 1 - low, high - 1)[0]
            else:
                algo = CISPO(Knobs(clip_low=1 - low, clip_high=high - 1))
                per = algo.token_loss(lp, old, adv, torch.ones_like(lp))[0]
        total = total + per.sum()
    return total


@pytest.mark.parametrize("loss_fn", list(CONFIG))
def test_loss_and_gradients_match_traingym(live, tokenizer, loss_fn):
    tc = live.client().create_lora_training_client(base_model="tiny", rank=4, seed=7).result()
    rows = [tokenizer.encode("What is 3 + 4? The answer is 7."), tokenizer.encode("What is 9")]
    first = tc.forward([datum(r) for r in rows], "cross_entropy").result()
    rng = np.random.default_rng(0)
    inputs = []
    for r, out in zip(rows, first.loss_fn_outputs):
        n = len(r) - 1
        cur = out["logprobs"].to_numpy()
        inputs.append({"weights": rng.uniform(0, 1, n).astype(np.float32).tolist()}
                      if loss_fn == "cross_entropy" else
                      {"logprobs": (cur + rng.normal(0, 0.2, n)).astype(np.float32).tolist(),
                       "advantages": rng.normal(0, 1, n).astype(np.float32).tolist()})
    out = tc.forward_backward([datum(r, **i) for r, i in zip(rows, inputs)], loss_fn,
                              CONFIG[loss_fn]).result()
    model = live.service.models[tc.model_id].model
    params = {n: p for n, p in model.named_parameters() if p.requires_grad}
    got = {n: p.grad.clone() for n, p in params.items()}
    for p in params.values():
        p.grad = None
    loss = reference(model, rows, inputs, loss_fn, CONFIG[loss_fn])
    loss.backward()
    loss = loss.detach()
    assert out.metrics["loss:sum"] == pytest.approx(loss.item(), rel=1e-5, abs=1e-6)
    elementwise = sum(o["elementwise_loss"].to_numpy().sum() for o in out.loss_fn_outputs)
    assert elementwise == pytest.approx(loss.item(), rel=1e-5, abs=1e-5)
    for n, p in params.items():
        # the server scores shared prompts once with a KV cache: float rounding of its sums
        # differs from one full row's, so the bound is relative to the tensor's scale
        scale = float(p.grad.abs().max())
        torch.testing.assert_close(got[n], p.grad, rtol=1e-5, atol=1e-6 * scale + 1e-9, msg=n)
        p.grad = None
    assert any(g.abs().sum() > 0 for g in got.values())


def test_passes_split_by_padded_tokens():
    from traingym.tinker.training import passes

    assert passes([3, 3, 3], 9) == [[0, 1, 2]]
    assert passes([3, 3, 3], 8) == [[0, 1], [2]]
    assert passes([2, 10, 2], 8) == [[0], [1], [2]]  # a longer datum runs alone
    assert passes([5], 1) == [[0]]


def test_a_request_split_into_passes_gives_the_same_gradient(live, tokenizer):
    """pass_tokens small enough for one datum a pass: the same loss and gradients (to fp32
    rounding) as one pass over both."""
    rows = [tokenizer.encode("What is 3 + 4? The answer is 7."), tokenizer.encode("What is 9")]
    data = [datum(r) for r in rows]
    tc = live.client().create_lora_training_client(base_model="tiny", rank=4, seed=7).result()
    m = live.service.models[tc.model_id]
    params = {n: p for n, p in m.model.named_parameters() if p.requires_grad}
    results = []
    for budget in (8192, 4):
        m.pass_tokens = budget
        out = tc.forward_backward(data, "cross_entropy").result()
        results.append((out.metrics["loss:sum"], {n: p.grad.clone() for n, p in params.items()}))
        for p in params.values():
            p.grad = None
    (loss_a, grads_a), (loss_b, grads_b) = results
    assert loss_a == pytest.approx(loss_b, rel=1e-6)
    for n in grads_a:
        torch.testing.assert_close(grads_a[n], grads_b[n], rtol=1e-5, atol=1e-6)


def test_shared_prompts_give_the_full_rows_result(live, tokenizer, monkeypatch):
    """RL-shaped datums (advantages 0 on the prompt): those sharing a prompt run it once with a
    KV cache and only their completions through the LM head; one whose targets are not its
    input shifted runs as a full row. Log-probs, losses and gradients equal the full-row
    forward of every datum (to fp32 rounding)."""
    from traingym.tinker import training

    prompt = tokenizer.encode("What is 3 + 4? The answer is")
    other = tokenizer.encode("What is 9 + 9? The answer is")
    rows = [prompt + tokenizer.encode(" 7."), prompt + tokenizer.encode(" 8, no"),
            prompt + tokenizer.encode(" 7"), other + tokenizer.encode(" 18.")]
    from tinker import types

    rng = np.random.default_rng(1)
    data = []
    for j, r in enumerate(rows):
        n, k = len(r) - 1, len((prompt if r[:len(prompt)] == prompt else other)) - 1
        adv = np.zeros(n, np.float32)
        adv[k:] = rng.normal(0, 1)
        inputs = {"logprobs": rng.normal(-2, 0.1, n).astype(np.float32).tolist(),
                  "advantages": adv.tolist()}
        if j % 2 == 0:  # the cookbook's datums: target 0 before the completion
            data.append(types.Datum(model_input=types.ModelInput.from_ints(r[:-1]),
                                    loss_fn_inputs={"target_tokens": [0] * k + r[k + 1:],
                                                    **inputs}))
        else:
            data.append(datum(r, **inputs))
    odd = list(rows[0])
    data.append(types.Datum(model_input=types.ModelInput.from_ints(odd[:-1]), loss_fn_inputs={
        "target_tokens": odd[1:][::-1], "logprobs": [-1.0] * (len(odd) - 1),
        "advantages": [0.5] * (len(odd) - 1)}))
    groups, full = training.shared_prompts(
        [(d.model_input.to_ints(), {k: v.to_numpy() if hasattr(v, "to_numpy") else v
                                    for k, v in d.loss_fn_inputs.items()}) for d in data],
        "importance_sampling")
    assert [len(m) for _, m in groups] == [3, 1] and full == [4]
    tc = live.client().create_lora_training_client(base_model="tiny", rank=4, seed=7).result()
    m = live.service.models[tc.model_id]
    params = {n: p for n, p in m.model.named_parameters() if p.requires_grad}
    results = []
    for split in (True, False):
        if not split:
            monkeypatch.setattr(training, "shared_prompts",
                                lambda data, loss_fn: ([], list(range(len(data)))))
        out = tc.forward_backward(data, "importance_sampling").result()
        results.append((out, {n: p.grad.clone() for n, p in params.items()}))
        for p in params.values():
            p.grad = None
    (a, grads_a), (b, grads_b) = results
    assert a.metrics["loss:sum"] == pytest.approx(b.metrics["loss:sum"], rel=1e-5, abs=1e-6)
    for oa, ob in zip(a.loss_fn_outputs, b.loss_fn_outputs):
        np.testing.assert_allclose(oa["logprobs"].to_numpy(), ob["logprobs"].to_numpy(),
                                   rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(oa["elementwise_loss"].to_numpy(),
                                   ob["elementwise_loss"].to_numpy(), rtol=1e-5, atol=1e-6)
    for n in grads_a:
        torch.testing.assert_close(grads_a[n], grads_b[n], rtol=1e-4, atol=1e-6, msg=n)
    assert any(g.abs().sum() > 0 for g in grads_a.values())
