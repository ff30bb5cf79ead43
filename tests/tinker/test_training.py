"""LoRA training clients through the official tinker SDK: cross_entropy falls over steps,
futures retrieved out of order, two clients on one base interleaved."""

import numpy as np
from conftest import datum


def _texts(tokenizer):
    return [tokenizer.encode(t) for t in ("What is 2 + 3? The answer is 5.",
                                          "What is 7 * 4? 28")]


def test_cross_entropy_falls(live, tokenizer):
    from tinker import types

    tc = live.client().create_lora_training_client(base_model="tiny", rank=4, seed=1).result()
    info = tc.get_info()
    assert info.is_lora and info.lora_rank == 4 and info.model_data.model_name == "tiny"
    assert tc.get_tokenizer().encode("What is 2") == tokenizer.encode("What is 2")
    data = [datum(t, weights=[1.0] * (len(t) - 1)) for t in _texts(tokenizer)]
    losses = []
    for _ in range(6):
        fb = tc.forward_backward(data, "cross_entropy")
        tc.optim_step(types.AdamParams(learning_rate=2e-2)).result()
        out = fb.result()
        losses.append(out.metrics["loss:sum"])
        assert len(out.loss_fn_outputs) == 2
        lp = out.loss_fn_outputs[0]["logprobs"].to_numpy()
        assert lp.shape == (len(data[0].model_input.to_ints()),) and (lp < 0).all()
        # the summed loss is -sum(weights * logprobs) over both datums
        total = -sum(o["logprobs"].to_numpy().sum() for o in out.loss_fn_outputs)
        assert np.isclose(total, losses[-1], rtol=1e-5)
    assert losses[-1] < 0.7 * losses[0], losses


def test_futures_out_of_order(live, tokenizer):
    from tinker import types

    tc = live.client().create_lora_training_client(base_model="tiny", rank=2, seed=0).result()
    data = [datum(_texts(tokenizer)[0])]
    futures = []
    for _ in range(3):
        futures.append(tc.forward_backward(data, "cross_entropy"))
        futures.append(tc.optim_step(types.AdamParams(learning_rate=1e-2)))
    last_fb = futures[4].result()  # the third forward_backward first
    first_fb = futures[0].result()
    assert [f.result().metrics is not None for f in futures[1::2]] == [True] * 3
    assert last_fb.metrics["loss:sum"] < first_fb.metrics["loss:sum"]
    # forward only: no gradient, the same outputs on the same weights
    a = tc.forward(data, "cross_entropy").result()
    b = tc.forward(data, "cross_entropy").result()
    assert a.metrics == b.metrics


def test_two_clients_interleaved(live, tokenizer):
    """Two LoRA clients on one base, stepped alternately, end where each alone would: the same
    seed and data give the same losses whether or not another client trains in between."""
    from tinker import types

    sc = live.client()
    a = sc.create_lora_training_client(base_model="tiny", rank=4, seed=3).result()
    b = sc.create_lora_training_client(base_model="tiny", rank=4, seed=3).result()
    c = sc.create_lora_training_client(base_model="tiny", rank=4, seed=5).result()
    data = [datum(_texts(tokenizer)[0])]
    other = [datum(_texts(tokenizer)[1])]
    seen_a, seen_b = [], []
    for _ in range(3):  # a and c interleaved; b alone afterwards
        fa = a.forward_backward(data, "cross_entropy")
        fc = c.forward_backward(other, "cross_entropy")
        a.optim_step(types.AdamParams(learning_rate=1e-2))
        c.optim_step(types.AdamParams(learning_rate=5e-2))
        seen_a.append(fa.result().metrics["loss:sum"])
        fc.result()
    for _ in range(3):
        fb = b.forward_backward(data, "cross_entropy")
        b.optim_step(types.AdamParams(learning_rate=1e-2)).result()
        seen_b.append(fb.result().metrics["loss:sum"])
    assert seen_a == seen_b
    # one copy of the base: the clients' frozen weights are the same tensors
    models = [live.service.models[x.model_id].model for x in (a, b, c)]
    base = {n: p for n, p in models[0].named_parameters() if ".lora_" not in n}
    for m in models[1:]:
        for n, p in m.named_parameters():
            if ".lora_" not in n:
                assert p is base[n]


def test_close_frees_the_session(live, tokenizer):
    sc = live.client()
    tc = sc.create_lora_training_client(base_model="tiny", rank=2, seed=0).result()
    assert tc.model_id in live.service.models
    sc.close("success").result()
    assert tc.model_id not in live.service.models


def test_forward_backward_custom_runs_on_the_client(live, tokenizer):
    """The SDK's forward_backward_custom: a forward, the loss on the client, then a
    cross_entropy backward with weights -dLoss/dlogprobs; the server sees two plain requests."""
    import torch

    tc = live.client().create_lora_training_client(base_model="tiny", rank=2, seed=9).result()
    data = [datum(_texts(tokenizer)[0])]

    def mean_nll(data, logprobs_list):
        loss = -torch.cat(logprobs_list).mean()
        return loss, {"nll:mean": float(loss)}

    out = tc.forward_backward_custom(data, mean_nll).result()
    plain = tc.forward(data, "cross_entropy").result()
    want = -plain.loss_fn_outputs[0]["logprobs"].to_numpy().mean()
    assert np.isclose(out.metrics["nll:mean"], want, rtol=1e-5)
    grads = [p.grad for p in live.service.models[tc.model_id].model.parameters()
             if p.requires_grad and p.grad is not None]
    assert grads and any(g.abs().sum() > 0 for g in grads)


def test_a_session_without_heartbeats_expires(live):
    import httpx

    sc = live.client()
    tc = sc.create_lora_training_client(base_model="tiny", rank=2, seed=0).result()
    sid = sc.holder.get_session_id()
    live.service.sessions[sid]["seen"] -= 10_000  # as if its heartbeats stopped long ago
    live.service.reap()  # (create_session and every heartbeat call it)
    assert tc.model_id not in live.service.models
    r = httpx.post(live.url + "/api/v1/session_heartbeat", headers={"X-API-Key": live.key},
                   json={"session_id": sid, "type": "session_heartbeat"})
    assert r.status_code == 410 and "expired" in r.json()["error"]["message"]
