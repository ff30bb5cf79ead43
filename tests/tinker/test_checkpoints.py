"""save_state / load through the SDK: continuing from a loaded state (weights and AdamW state)
equals continuing in place, bit for bit; checkpoints are listed; a sampler checkpoint serves
the saved weights."""

import numpy as np
import pytest
from conftest import datum


def _step(tc, data, lr=3e-2):
    from tinker import types

    fb = tc.forward_backward(data, "cross_entropy")
    tc.optim_step(types.AdamParams(learning_rate=lr, weight_decay=0.01)).result()
    return fb.result().metrics["loss:sum"]


def test_load_equals_continuing_in_place(live, tokenizer):
    import tinker

    sc = live.client()
    tc = sc.create_lora_training_client(base_model="tiny", rank=4, seed=21).result()
    data = [datum(tokenizer.encode("What is 6 * 7? 42"))]
    for _ in range(2):
        _step(tc, data)
    path = tc.save_state("after-2").result().path
    assert path == f"tinker://{tc.model_id}/weights/after-2"
    in_place = [_step(tc, data) for _ in range(3)]
    loaded = sc.create_training_client_from_state_with_optimizer(path).result()
    assert loaded.get_info().lora_rank == 4
    resumed = [_step(loaded, data) for _ in range(3)]
    assert resumed == in_place  # bitwise: floats compared with ==
    a = tc.forward(data, "cross_entropy").result().loss_fn_outputs[0]["logprobs"].to_numpy()
    b = loaded.forward(data, "cross_entropy").result().loss_fn_outputs[0]["logprobs"].to_numpy()
    assert np.array_equal(a, b)
    # weights only (a fresh AdamW): the first step matches, later ones differ
    fresh = sc.create_training_client_from_state(path).result()
    assert _step(fresh, data) == in_place[0]
    # load_state into an existing client (deprecated in the SDK, still sent as load_weights)
    with pytest.warns(FutureWarning):
        fresh.load_state_with_optimizer(path).result()
    assert [_step(fresh, data) for _ in range(3)] == in_place
    listed = tinker.RestClient(base_url=live.url, api_key=live.key).list_checkpoints(
        tc.model_id).result()
    assert [c.tinker_path for c in listed.checkpoints] == [path]
    assert listed.checkpoints[0].checkpoint_type == "training"


def test_sampler_checkpoint_serves_saved_weights(live, tokenizer):
    from tinker import types

    sc = live.client()
    tc = sc.create_lora_training_client(base_model="tiny", rank=2, seed=4).result()
    data = [datum(tokenizer.encode("What is 5 - 2? 3"))]
    _step(tc, data, lr=1e-1)
    path = tc.save_weights_for_sampler("s1").result().path
    assert path.endswith("/sampler_weights/s1")
    sampler = sc.create_sampling_client(model_path=path).result()
    assert sampler.get_base_model() == "tiny"
    prompt = tokenizer.encode("What is 5")
    scored = sampler.compute_logprobs(types.ModelInput.from_ints(prompt)).result()
    want = tc.forward([datum(prompt)], "cross_entropy").result().loss_fn_outputs[0]["logprobs"]
    np.testing.assert_allclose(scored[1:], want.to_numpy(), rtol=1e-4, atol=1e-4)


def test_bad_paths_are_refused(live):
    import tinker

    sc = live.client()
    with pytest.raises(tinker.BadRequestError, match="tinker://"):
        sc.create_training_client_from_state("/etc/passwd").result()
    with pytest.raises(tinker.NotFoundError, match="no checkpoint"):
        sc.create_training_client_from_state("tinker://nope:train:0/weights/x").result()
    with pytest.raises(tinker.BadRequestError):
        sc.create_training_client_from_state("tinker://../weights/x").result()


def test_rest_reads_and_delete(live, tokenizer):
    import tinker

    sc = live.client()
    tc = sc.create_lora_training_client(base_model="tiny", rank=3, seed=1).result()
    path = tc.save_state("r1").result().path
    sampler_path = tc.save_weights_for_sampler("r1s").result().path
    rest = tinker.RestClient(base_url=live.url, api_key=live.key)
    run = rest.get_training_run(tc.model_id).result()
    assert (run.base_model, run.is_lora, run.lora_rank) == ("tiny", True, 3)
    assert run.last_checkpoint.tinker_path == path
    assert run.last_sampler_checkpoint.tinker_path == sampler_path
    info = rest.get_weights_info_by_tinker_path(path).result()
    assert (info.base_model, info.is_lora, info.lora_rank, info.train_mlp) == ("tiny", True, 3,
                                                                               True)
    rest.delete_checkpoint_from_tinker_path(path).result()
    left = rest.list_checkpoints(tc.model_id).result().checkpoints
    assert [c.tinker_path for c in left] == [sampler_path]
    with pytest.raises(tinker.NotFoundError):
        sc.create_training_client_from_state(path).result()
