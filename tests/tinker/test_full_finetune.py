"""Full fine-tuning (create_model without a LoRA config): the SDK has no public method for it,
so the model is created with a plain create_model request and then driven by the SDK's own
TrainingClient on the same session. Loss falls, the sampler serves the full weights, a
save / load round trip continues bitwise."""

import httpx
import numpy as np
from conftest import datum


def _full_client(live, sc):
    from tinker.lib.public_interfaces.training_client import TrainingClient, fetch_training_info

    holder = sc.holder
    seq = holder.get_training_client_id()
    h = {"X-API-Key": live.key}
    fut = httpx.post(live.url + "/api/v1/create_model", headers=h, json={
        "session_id": holder.get_session_id(), "model_seq_id": seq, "base_model": "tiny",
        "type": "create_model"}).json()
    while (got := httpx.post(live.url + "/api/v1/retrieve_future", headers=h, timeout=30,
                             json={"request_id": fut["request_id"]})).status_code == 408:
        assert got.json()["type"] == "try_again"
    r = got.json()
    info = holder.run_coroutine_threadsafe(fetch_training_info(holder, r["model_id"])).result()
    return TrainingClient(holder, model_seq_id=seq, model_id=r["model_id"], info=info)


def test_full_finetune(live, tokenizer):
    from tinker import types

    sc = live.client()
    tc = _full_client(live, sc)
    assert tc.get_info().is_lora is False
    data = [datum(tokenizer.encode("What is 8 + 1? The answer is 9."))]
    losses = []
    for _ in range(4):
        fb = tc.forward_backward(data, "cross_entropy")
        tc.optim_step(types.AdamParams(learning_rate=1e-2)).result()
        losses.append(fb.result().metrics["loss:sum"])
    assert losses[-1] < 0.7 * losses[0]
    sampler = tc.save_weights_and_get_sampling_client().result()
    prompt = tokenizer.encode("What is 8")
    scored = sampler.compute_logprobs(types.ModelInput.from_ints(prompt)).result()
    want = tc.forward([datum(prompt)], "cross_entropy").result().loss_fn_outputs[0]["logprobs"]
    np.testing.assert_allclose(scored[1:], want.to_numpy(), rtol=1e-4, atol=1e-4)
    path = tc.save_state("full").result().path
    loaded = sc.create_training_client_from_state_with_optimizer(path).result()
    assert loaded.get_info().is_lora is False

    def step(c):
        fb = c.forward_backward(data, "cross_entropy")
        c.optim_step(types.AdamParams(learning_rate=1e-2)).result()
        return fb.result().metrics["loss:sum"]

    assert [step(tc) for _ in range(2)] == [step(loaded) for _ in range(2)]
