"""Sampling through the tinker SDK: the sampler serves the training client's weights (sampled
log-probs at temperature 1 equal the trainer's forward log-probs of the same tokens), seeds
repeat, stop tokens and strings stop, sessions on one engine do not leak weights into each
other, compute_logprobs scores the prompt."""

import numpy as np
import pytest
from conftest import datum


def _trained(live, tokenizer, seed, steps=3, lr=5e-2):
    from tinker import types

    sc = live.client()
    tc = sc.create_lora_training_client(base_model="tiny", rank=4, seed=seed).result()
    data = [datum(tokenizer.encode("What is 2 + 3? The answer is 5."))]
    for _ in range(steps):
        tc.forward_backward(data, "cross_entropy")
        tc.optim_step(types.AdamParams(learning_rate=lr)).result()
    return sc, tc


def _forward_logprobs(tc, tokens):
    out = tc.forward([datum(tokens)], "cross_entropy").result()
    return out.loss_fn_outputs[0]["logprobs"].to_numpy()


def test_samples_carry_the_trained_weights(live, tokenizer):
    from tinker import types

    sc, tc = _trained(live, tokenizer, seed=11)
    sampler = tc.save_weights_and_get_sampling_client().result()
    prompt = tokenizer.encode("What is 2 +")
    params = types.SamplingParams(max_tokens=6, temperature=1.0, seed=5, stop=[])
    res = sampler.sample(types.ModelInput.from_ints(prompt), num_samples=3,
                         sampling_params=params).result()
    assert len(res.sequences) == 3
    again = sampler.sample(types.ModelInput.from_ints(prompt), num_samples=3,
                           sampling_params=params).result()
    for seq, seq2 in zip(res.sequences, again.sequences):
        assert len(seq.tokens) == 6 and seq.stop_reason == "length"
        assert seq.tokens == seq2.tokens  # the same seed, the same samples
        want = _forward_logprobs(tc, prompt + list(seq.tokens))[len(prompt) - 1:]
        np.testing.assert_allclose(seq.logprobs, want, rtol=1e-4, atol=1e-4)
    scored = sampler.compute_logprobs(types.ModelInput.from_ints(prompt)).result()
    assert scored[0] is None
    np.testing.assert_allclose(scored[1:], _forward_logprobs(tc, prompt), rtol=1e-4, atol=1e-4)


def test_sessions_on_one_engine_keep_their_own_weights(live, tokenizer):
    from tinker import types

    _, tc_a = _trained(live, tokenizer, seed=1, lr=1e-1)
    _, tc_b = _trained(live, tokenizer, seed=2, lr=1e-1)
    sa = tc_a.save_weights_and_get_sampling_client().result()
    sb = tc_b.save_weights_and_get_sampling_client().result()
    base = live.client().create_sampling_client(base_model="tiny").result()
    prompt = types.ModelInput.from_ints(tokenizer.encode("What is 7"))
    params = types.SamplingParams(max_tokens=4, temperature=1.0, seed=3, stop=[])

    def lps(s):
        seq = s.sample(prompt, 1, params).result().sequences[0]
        return list(seq.tokens), list(seq.logprobs)

    first_a, first_b, first_base = lps(sa), lps(sb), lps(base)
    assert lps(sa) == first_a and lps(base) == first_base and lps(sb) == first_b
    assert first_a[1] != first_b[1] and first_a[1] != first_base[1]


def test_stop_tokens_and_strings(live, tokenizer):
    from tinker import types

    sampler = live.client().create_sampling_client(base_model="tiny").result()
    prompt = types.ModelInput.from_ints(tokenizer.encode("What is 1 + 1?"))
    free = sampler.sample(prompt, 1, types.SamplingParams(max_tokens=8, temperature=0.0,
                                                          stop=[])).result().sequences[0]
    assert free.stop_reason == "length" and len(free.tokens) == 8
    third = free.tokens[2]
    cut = sampler.sample(prompt, 1, types.SamplingParams(max_tokens=8, temperature=0.0,
                                                         stop=[third])).result().sequences[0]
    assert cut.stop_reason == "stop" and cut.tokens == free.tokens[:free.tokens.index(third) + 1]
    text = tokenizer.decode(free.tokens[:3])
    by_text = sampler.sample(prompt, 1, types.SamplingParams(
        max_tokens=8, temperature=0.0, stop=[text[-2:]])).result().sequences[0]
    assert by_text.stop_reason == "stop" and len(by_text.tokens) <= 3
    assert text[-2:] in tokenizer.decode(by_text.tokens)


def test_sampling_refusals(live, tokenizer):
    import tinker
    from tinker import types

    sampler = live.client().create_sampling_client(base_model="tiny").result()
    prompt = types.ModelInput.from_ints(tokenizer.encode("What"))
    with pytest.raises(tinker.BadRequestError, match="max_tokens"):
        sampler.sample(prompt, 1, types.SamplingParams(max_tokens=10**6)).result()
    with pytest.raises(tinker.BadRequestError, match="num_samples"):
        sampler.sample(prompt, 1000, types.SamplingParams(max_tokens=2)).result()
    with pytest.raises(tinker.BadRequestError, match="topk_prompt_logprobs"):
        sampler.sample(prompt, 1, types.SamplingParams(max_tokens=2), include_prompt_logprobs=True,
                       topk_prompt_logprobs=3).result()
    ok = sampler.sample(prompt, 1, types.SamplingParams(max_tokens=2)).result()
    assert len(ok.sequences) == 1


def test_inflight_samplers_follow_later_saves(live, tokenizer):
    from tinker import types

    _, tc = _trained(live, tokenizer, seed=8, steps=1)
    prompt = types.ModelInput.from_ints(tokenizer.encode("What is 2 + 3?"))
    snap = tc.save_weights_and_get_sampling_client().result()
    first = tc.save_weights_and_get_sampling_client(kind="inflight").result()
    before = first.compute_logprobs(prompt).result()
    data = [datum(tokenizer.encode("What is 2 + 3? The answer is 5."))]
    tc.forward_backward(data, "cross_entropy")
    tc.optim_step(types.AdamParams(learning_rate=1e-1)).result()
    second = tc.save_weights_and_get_sampling_client(kind="inflight").result()
    now = _forward_logprobs(tc, prompt.to_ints())
    for client in (first, second):  # both inflight clients serve the newest save
        np.testing.assert_allclose(client.compute_logprobs(prompt).result()[1:], now,
                                   rtol=1e-4, atol=1e-4)
    assert snap.compute_logprobs(prompt).result() == before  # the snapshot did not move
    assert not np.allclose(before[1:], now, atol=1e-4)


def test_a_local_folder_base(live, tokenizer):
    """A Hugging Face folder named in the server's `models`: trains and samples; there the
    SamplingClient's get_tokenizer (which loads the base model's name) works too."""
    from tinker import types

    sc = live.client()
    tc = sc.create_lora_training_client(base_model=live.folder, rank=2, seed=0).result()
    assert tc.get_info().model_data.model_name == live.folder
    tokens = tokenizer.encode("What is 6 + 6? 12")
    fb = tc.forward_backward([datum(tokens)], "cross_entropy")
    tc.optim_step(types.AdamParams(learning_rate=1e-2)).result()
    assert fb.result().metrics["loss:sum"] > 0
    sampler = tc.save_weights_and_get_sampling_client().result()
    assert sampler.get_tokenizer().encode("What is 6") == tokenizer.encode("What is 6")
    out = sampler.sample(types.ModelInput.from_ints(tokens[:4]), 2,
                         types.SamplingParams(max_tokens=3, seed=1)).result()
    assert [len(s.tokens) <= 3 for s in out.sequences] == [True, True]


def test_top_k_sampled_logprobs(live, tokenizer):
    from tinker import types

    sampler = live.client().create_sampling_client(base_model="tiny").result()
    prompt = types.ModelInput.from_ints(tokenizer.encode("What is 3"))
    out = sampler.sample(prompt, 2, types.SamplingParams(max_tokens=4, temperature=1.0, seed=2,
                                                         stop=[]),
                         topk_sample_logprobs=3).result()
    for seq in out.sequences:
        assert len(seq.topk_logprobs) == len(seq.tokens) == 4
        for tok, lp, row in zip(seq.tokens, seq.logprobs, seq.topk_logprobs):
            lps = [x for _, x in row]
            assert len(row) == 3 and lps == sorted(lps, reverse=True)
            assert lp <= lps[0] + 1e-6  # the sampled token is at most the most likely
            if tok in [t for t, _ in row]:
                assert abs(dict(row)[tok] - lp) < 1e-5


def test_concurrent_samples_run_as_one_batch(live, tokenizer):
    """Sample requests of one session queued together are decoded in one engine call, with the
    results each would get alone (greedy: the same tokens; log-probs to fp32 rounding); one
    bad request in the batch fails alone."""
    import threading
    import time

    import tinker
    from tinker import types

    sampler = live.client().create_sampling_client(base_model="tiny").result()
    texts = ["What is 1", "What is 12 + 3?", "What", "What is 7 * 8? The"]
    prompts = [types.ModelInput.from_ints(tokenizer.encode(t)) for t in texts]
    params = types.SamplingParams(max_tokens=5, temperature=0.0, stop=[])
    alone = [sampler.sample(p, 1, params).result().sequences[0] for p in prompts]
    engine = next(iter(live.service.engines.engines.values()))
    gate, calls = threading.Event(), []
    live.service.futures.submit(lambda: gate.wait(30) and {})  # hold the worker
    real = engine.generate_sync
    engine.generate_sync = lambda reqs: calls.append(len(reqs)) or real(reqs)
    try:
        futures = [sampler.sample(p, 1, params) for p in prompts]
        too_long = sampler.sample(prompts[0], 1, types.SamplingParams(max_tokens=1000))
        deadline = time.monotonic() + 30
        while sum(1 for q in list(live.service.futures.work) if q is not None and q.key) < 5:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        gate.set()
        together = [f.result().sequences[0] for f in futures]
        with pytest.raises(tinker.RequestFailedError, match="exceeds the model's context"):
            too_long.result()
    finally:
        del engine.generate_sync
    assert calls == [4]
    for a, b in zip(alone, together):
        assert a.tokens == b.tokens
        np.testing.assert_allclose(a.logprobs, b.logprobs, rtol=1e-4, atol=1e-4)
