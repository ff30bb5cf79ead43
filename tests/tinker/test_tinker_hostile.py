"""Hostile and broken requests are answered 4xx naming the problem, and the server keeps
serving: a bad or missing key, unknown ids, wrong tensor lengths, an unknown loss, token ids
out of range, an oversize body, garbage bodies."""

import httpx
import pytest
from conftest import datum


def _post(live, path, key=None, **kw):
    headers = {"X-API-Key": live.key if key is None else key, **kw.pop("headers", {})}
    return httpx.post(live.url + "/api/v1/" + path, headers=headers, timeout=30, **kw)


def _fb_body(model_id, tokens, seq_id=0, loss_fn="cross_entropy", **inputs):
    from tinker import types
    from tinker.proto.request_conv import forward_backward_request_to_proto

    req = types.ForwardBackwardRequest(
        forward_backward_input=types.ForwardBackwardInput(data=[datum(tokens, **inputs)],
                                                          loss_fn=loss_fn),
        model_id=model_id, seq_id=seq_id)
    return forward_backward_request_to_proto(req).SerializeToString()


def test_keys(live):
    import tinker

    assert httpx.get(live.url + "/api/v1/healthz").json() == {"status": "ok"}  # no key needed
    r = httpx.get(live.url + "/api/v1/get_server_capabilities")
    assert r.status_code == 401 and "no X-API-Key" in r.json()["error"]["message"]
    r = httpx.get(live.url + "/api/v1/get_server_capabilities", headers={"X-API-Key": "tml-x"})
    assert r.status_code == 401 and "wrong API key" in r.json()["error"]["message"]
    with pytest.raises(tinker.AuthenticationError):
        tinker.ServiceClient(base_url=live.url, api_key="tml-wrong").create_sampling_client(
            base_model="tiny").result()
    caps = tinker.RestClient(base_url=live.url, api_key=live.key).get_server_capabilities()
    assert [m.model_name for m in caps.result().supported_models] == ["tiny", live.folder]


def test_bad_requests_then_still_serving(live, tokenizer):
    import tinker
    from tinker import types

    sc = live.client()
    with pytest.raises(tinker.BadRequestError, match="not served here"):
        sc.create_lora_training_client(base_model="gpt-9000", rank=4).result()
    with pytest.raises(tinker.BadRequestError, match="lora rank"):
        sc.create_lora_training_client(base_model="tiny", rank=100000).result()
    tc = sc.create_lora_training_client(base_model="tiny", rank=2, seed=0).result()
    tokens = tokenizer.encode("What is 1 + 2? 3")
    n = len(tokens) - 1
    with pytest.raises(tinker.BadRequestError, match="3 values for .* input tokens"):
        tc.forward([datum(tokens, weights=[1.0] * 3)], "cross_entropy").result()
    tc = sc.create_lora_training_client(base_model="tiny", rank=2, seed=0).result()
    with pytest.raises(tinker.BadRequestError, match="not supported"):
        tc.forward_backward([datum(tokens)], "dro").result()

    model_id = tc.model_id
    cases = {  # raw requests: (path, body or json, headers) -> status, text in the message
        "unknown model": (_fb_body("nope:train:0", tokens), 404, "no training client"),
        "bad token": (_fb_body(model_id, [0, 10**6, 3]), 400, "token ids"),
        "missing input": (_fb_body(model_id, tokens, loss_fn="ppo"), 400, "needs loss_fn"),
        "garbage": (b"\xff\x00garbage", 400, "protobuf"),
        "2-D weights": (_fb_body(model_id, tokens, weights=types.TensorData(
            data=[1.0] * 2 * n, dtype="float32", shape=[n, 2])), 400, "only 1-D tensors"),
    }
    for name, (body, status, text) in cases.items():
        r = _post(live, "forward_backward", content=body,
                  headers={"Content-Type": "application/x-protobuf"})
        assert r.status_code == status and text in r.json()["error"]["message"], (name, r.text)
    r = _post(live, "forward_backward", content=_fb_body(model_id, tokens),
              headers={"Content-Type": "application/x-protobuf", "Content-Encoding": "zstd"})
    assert r.status_code == 400 and "zstd" in r.json()["error"]["message"]
    r = _post(live, "optim_step", json={"model_id": model_id, "adam_params": {"lr": 1}})
    assert r.status_code == 400 and "adam_params" in r.json()["error"]["message"]
    r = _post(live, "retrieve_future", json={"request_id": "nope"})
    assert r.status_code == 404
    r = _post(live, "create_session", content=b"{not json")
    assert r.status_code == 400 and "JSON" in r.json()["error"]["message"]
    r = _post(live, "session_heartbeat", json={"session_id": "nope", "type": "session_heartbeat"})
    assert r.status_code == 404
    r = _post(live, "asample", json={"sampling_session_id": "nope", "prompt": {"chunks": []},
                                      "sampling_params": {}})
    assert r.status_code == 404
    big = _post(live, "telemetry", content=b"x" * (2 << 20))  # the test server's limit: 1 MiB
    assert big.status_code == 413 and "max_body_bytes" in big.json()["error"]["message"]
    r = httpx.get(live.url + "/api/v1/no_such_route", headers={"X-API-Key": live.key})
    assert r.status_code == 404

    # still serving: the refused calls left the client usable, and a new one trains
    out = tc.forward_backward([datum(tokens, weights=[1.0] * n)], "cross_entropy").result()
    assert out.metrics["loss:sum"] > 0


def test_zstd_body_and_large_batches_are_split(live, tokenizer):
    """A zstd-compressed forward_backward body is read; the SDK splits a batch over the
    server's body limit (sent in the client config) into several requests."""
    import zstandard

    sc = live.client()
    tc = sc.create_lora_training_client(base_model="tiny", rank=2, seed=0).result()
    tokens = tokenizer.encode("What is 4 + 4? 8")
    body = zstandard.ZstdCompressor().compress(_fb_body(tc.model_id, tokens, seq_id=1))
    r = _post(live, "forward_backward", content=body, headers={
        "Content-Type": "application/x-protobuf", "Content-Encoding": "zstd"})
    assert r.status_code == 200, r.text
    got = _post(live, "retrieve_future", json={"request_id": r.json()["request_id"]})
    assert got.headers["content-type"].startswith("application/x-protobuf")
    # 1 MiB body limit on the test server: ~600 KiB of datums goes as two requests or more
    tc = sc.create_lora_training_client(base_model="tiny", rank=2, seed=0).result()  # its own
    long = (tokens * 40)[:200]  # seq_ids: the raw request above used the first one's seq 1
    many = [datum(long) for _ in range(400)]
    seen = []
    original = live.service.forward_backward
    live.service.forward_backward = lambda req: seen.append(len(req["data"])) or original(req)
    try:
        out = tc.forward(many, "cross_entropy").result()
    finally:
        del live.service.forward_backward
    assert len(out.loss_fn_outputs) == 400 and len(seen) >= 2 and sum(seen) == 400


def test_retrieve_futures_refusals(live, tokenizer):
    """/retrieve_futures: an unknown session or clone 404, a wrong body 400, too many
    retrieved ids 400, another target's or unknown ids left alone; then still serving."""
    from tinker import types

    sampler = live.client().create_sampling_client(base_model="tiny").result()
    prompt = types.ModelInput.from_ints(tokenizer.encode("What"))
    params = types.SamplingParams(max_tokens=2, temperature=0.0)
    sid = sampler._sampling_session_id
    target = {"type": "sampling_session", "sampling_session_id": sid}
    assert sampler.sample(prompt, 1, params).result().sequences  # the target exists now
    limit = live.service.cfg.kept_results
    cases = {
        "unknown session": ({"target": {**target, "sampling_session_id": "nope"}}, 404,
                            "no sampling session"),
        "unknown clone": ({"target": {**target, "cloned_sampler_id": 7}, "timeout": 0}, 404,
                          "clone 7"),
        "no target": ({"prev_cursor": 0}, 400, "target"),
        "extra field": ({"target": target, "bogus": 1}, 400, "bogus"),
        "wrong type": ({"target": {**target, "type": "training_run"}}, 400, "target"),
        "negative cursor": ({"target": target, "prev_cursor": -1}, 400, ">= 0"),
        "negative timeout": ({"target": target, "timeout": -5}, 400, ">= 0"),
        "ids not a list": ({"target": target, "retrieved_request_ids": "abc"}, 400,
                           "retrieved_request_ids"),
        "too many ids": ({"target": target, "retrieved_request_ids": ["x"] * (limit + 1)}, 400,
                         "kept_results"),
    }
    for name, (body, status, text) in cases.items():
        r = _post(live, "retrieve_futures", json=body)
        assert r.status_code == status and text in r.json()["error"]["message"], (name, r.text)
    r = _post(live, "retrieve_futures", content=b"[1, 2")
    assert r.status_code == 400 and "JSON" in r.json()["error"]["message"]
    r = _post(live, "retrieve_futures", json={"target": target, "timeout": 0,
                                              "retrieved_request_ids": ["nope", "x" * 500]})
    assert r.status_code == 200 and isinstance(r.json()["cursor"], int)
    assert sampler.sample(prompt, 1, params).result().sequences  # still serving
