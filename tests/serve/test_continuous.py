"""Continuous batching and token-by-token streaming of `traingym serve` on the built-in engine
(serve/continuous.py, serve/live.py), against the uvicorn subprocess of conftest.py on a
checkpoint of the tiny preset.

Covered: a short request that arrives while a long one decodes finishes first; a stream's
first content chunks arrive while its request is still decoding, and the chunks concatenate
to the plain answer; 16 concurrent greedy requests (staggered lengths) give the tokens and
log-probs of the engine's one-at-a-time `generate` (1e-4); a client that leaves mid-stream
frees its row (and its slot) long before its max_tokens; live streams of n=2 chat and of two
completions prompts equal the plain answers per choice (text, log-probs, finish_reason)."""

import asyncio
import json
import time

import httpx
import pytest
from safetensors.torch import load_model

from traingym.models.families import stop_token_ids
from traingym.models.loader import load_policy
from traingym.models.token_strings import piece_ids
from traingym.rollout.torch_engine import TorchEngine
from traingym.core.types import GenerationRequest, SamplingParams

LONG = 600  # tokens: the tiny checkpoint does not stop by itself on these prompts (checked)


def health(server) -> dict:
    return httpx.get(server.url + "/health", timeout=30).json()


def wait_live(server, timeout=60):
    deadline = time.monotonic() + timeout
    while health(server)["batching"]["live_rows"] < 1:
        assert time.monotonic() < deadline, "the long request never started decoding"
        time.sleep(0.01)


def test_short_request_does_not_wait_for_a_long_one(ckpt_server):
    assert health(ckpt_server)["batching"]["mode"] == "continuous"

    async def main():
        async with httpx.AsyncClient(base_url=ckpt_server.url, timeout=300) as c:
            done = {}

            async def ask(name, max_tokens):
                r = await c.post("/v1/completions", json={
                    "model": ckpt_server.model, "prompt": "What is 2 + 3?",
                    "max_tokens": max_tokens, "temperature": 0})
                done[name] = time.monotonic()
                return r.json()

            long = asyncio.create_task(ask("long", LONG))
            await asyncio.to_thread(wait_live, ckpt_server)
            short = await ask("short", 3)
            assert "long" not in done, "the short request waited for the long one"
            body = await long
            return short, body, done
    short, body, done = asyncio.run(main())
    assert short["usage"]["completion_tokens"] == 3
    assert body["usage"]["completion_tokens"] == LONG, "the long request stopped early"
    assert done["short"] < done["long"]


def sse_events(lines):
    for line in lines:
        if line.startswith("data: ") and line != "data: [DONE]":
            yield json.loads(line[6:])


def test_stream_sends_tokens_while_decoding_and_equals_plain(ckpt_server):
    body = {"model": ckpt_server.model, "temperature": 0, "max_tokens": 1000,
            "messages": [{"role": "user", "content": "What is 7 + 8?"}]}
    plain = httpx.post(ckpt_server.url + "/v1/chat/completions", json=body, timeout=300).json()
    pieces, live_at = [], []
    with httpx.stream("POST", ckpt_server.url + "/v1/chat/completions", timeout=300,
                      json={**body, "stream": True}) as r:
        for ev in sse_events(r.iter_lines()):
            content = ev["choices"][0]["delta"].get("content")
            if content:
                pieces.append(content)
                if not live_at:  # is the request still decoding (~1000 steps to go)?
                    live_at.append(health(ckpt_server)["batching"]["live_rows"])
            fin = ev["choices"][0]["finish_reason"]
    assert len(pieces) > 1 and live_at == [1]
    assert "".join(pieces) == plain["choices"][0]["message"]["content"]
    assert fin == plain["choices"][0]["finish_reason"]


@pytest.fixture(scope="module")
def one_at_a_time(tiny_checkpoint):
    """The built-in engine on the checkpoint, answering each request alone (generate)."""
    model, tok = load_policy("tiny", seed=0)
    load_model(model, str(tiny_checkpoint / "model.safetensors"))
    return TorchEngine(model.eval(), tok.pad_token_id), tok, stop_token_ids(tok)


def test_16_concurrent_greedy_equal_generate_alone(ckpt_server, one_at_a_time):
    engine, tok, stops = one_at_a_time
    prompts = [tok(f"What is {i} + {3 * i}? Then {i} times 2.",
                   add_special_tokens=False)["input_ids"] for i in range(16)]
    lengths = [5 + 7 * i % 23 for i in range(16)]

    async def main():
        async with httpx.AsyncClient(base_url=ckpt_server.url, timeout=300) as c:
            async def ask(ids, n):
                await asyncio.sleep(0.01 * len(ids) % 0.05)  # staggered arrivals
                r = await c.post("/v1/completions", json={
                    "model": ckpt_server.model, "prompt": ids, "max_tokens": n,
                    "temperature": 0, "logprobs": 2})
                return r.json()["choices"][0]
            return await asyncio.gather(*(ask(p, n) for p, n in zip(prompts, lengths)))
    got = asyncio.run(main())
    for ids, n, choice in zip(prompts, lengths, got):
        comp = engine.generate_sync([GenerationRequest(tuple(ids), 1, SamplingParams(
            0, max_new_tokens=n, stop_token_ids=stops, top_logprobs=2))])[0][0]
        body = [t for t in comp.token_ids if t not in stops]
        lp = choice["logprobs"]
        assert [piece_ids(tok)[t] for t in lp["tokens"]] == body  # token ids
        assert choice["text"] == tok.decode(body)
        assert lp["token_logprobs"] == pytest.approx(comp.logprobs[:len(body)], abs=1e-4)
        for tops, want in zip(lp["top_logprobs"], comp.top_logprobs):
            assert list(tops.values()) == pytest.approx([x for _, x in want], abs=1e-4)


def test_disconnect_mid_stream_frees_the_row(ckpt_server):
    before = health(ckpt_server)
    assert before["in_flight"] == 0
    with httpx.stream("POST", ckpt_server.url + "/v1/completions", timeout=300, json={
            "model": ckpt_server.model, "prompt": "What is 1 + 1?", "max_tokens": LONG,
            "temperature": 0, "stream": True}) as r:
        got = 0
        for ev in sse_events(r.iter_lines()):
            got += bool(ev["choices"][0]["text"])
            if got == 2:
                break  # leave: closes the connection
    deadline = time.monotonic() + 30
    while (h := health(ckpt_server))["batching"]["live_rows"] or h["in_flight"]:
        assert time.monotonic() < deadline, f"the row was not freed: {h}"
        time.sleep(0.05)
    steps = h["batching"]["steps"] - before["batching"]["steps"]
    assert steps < LONG / 2, f"{steps} decode steps: the row ran on after the client left"
    ok = httpx.post(ckpt_server.url + "/v1/completions", timeout=120, json={
        "model": ckpt_server.model, "prompt": "What is 1 + 1?", "max_tokens": 3})
    assert ok.status_code == 200


def test_streams_of_several_choices_equal_plain_answers(ckpt_server):
    """n=2 chat with log-probs and two prompts of legacy completions, streamed live: per
    choice, the text and log-probs of the chunks equal the plain answer's (same seed)."""
    chat = {"model": ckpt_server.model, "temperature": 0.9, "seed": 3, "n": 2,
            "max_tokens": 20, "logprobs": True, "top_logprobs": 2,
            "messages": [{"role": "user", "content": "What is 5 + 6?"}]}
    comp = {"model": ckpt_server.model, "temperature": 0.9, "seed": 4, "max_tokens": 20,
            "logprobs": 1, "prompt": ["What is 1 + 9?", "日本 café"]}
    for path, body in (("/v1/chat/completions", chat), ("/v1/completions", comp)):
        plain = httpx.post(ckpt_server.url + path, json=body, timeout=300).json()
        text, lps, fins = {}, {}, {}
        with httpx.stream("POST", ckpt_server.url + path, timeout=300,
                          json={**body, "stream": True}) as r:
            for ev in sse_events(r.iter_lines()):
                c = ev["choices"][0]
                i = c["index"]
                text[i] = text.get(i, "") + (c["delta"].get("content") or "" if "delta" in c
                                             else c["text"])
                if c.get("logprobs"):
                    got = (c["logprobs"]["content"] if "delta" in c
                           else c["logprobs"]["token_logprobs"])
                    lps.setdefault(i, []).extend(e["logprob"] if isinstance(e, dict) else e
                                                 for e in got)
                if c["finish_reason"]:
                    fins[i] = c["finish_reason"]
        for c in plain["choices"]:
            i = c["index"]
            want = c["message"]["content"] if "message" in c else c["text"]
            want_lps = ([e["logprob"] for e in c["logprobs"]["content"]] if "message" in c
                        else c["logprobs"]["token_logprobs"])
            assert text[i] == want and fins[i] == c["finish_reason"], (path, i)
            assert lps.get(i, []) == pytest.approx(want_lps, abs=1e-6), (path, i)
        assert sorted(text) == [0, 1]


def test_a_request_whose_stream_callback_raises_fails_alone(one_at_a_time):
    """In process: a streaming request whose callback raises gets that error, its row is
    retired, and a request beside it finishes with the engine's own answer; the batcher
    keeps taking requests."""
    from traingym.serve.continuous import ContinuousBatcher

    engine, tok, stops = one_at_a_time
    ids = tuple(tok("What is 2 + 3?", add_special_tokens=False)["input_ids"])

    def req(n):
        return GenerationRequest(ids, 1, SamplingParams(0, max_new_tokens=n,
                                                        stop_token_ids=stops))

    def boom(*_):
        raise RuntimeError("the client's socket broke")

    async def main():
        b = ContinuousBatcher(engine, tok, stops)
        b.start()
        bad = b.open(req(40), on_event=boom)
        good = asyncio.ensure_future(b.submit(req(12)))
        with pytest.raises(RuntimeError, match="socket broke"):  # not a hang: 60 s at most
            await asyncio.wait_for(asyncio.shield(bad.future), 60)
        answer = (await asyncio.wait_for(good, 60))[0]
        again = (await asyncio.wait_for(b.submit(req(5)), 60))[0]
        await b.close()
        return answer, again, b.decoder.live
    answer, again, live = asyncio.run(main())
    want = engine.generate_sync([req(12)])[0][0]
    assert answer.token_ids == want.token_ids
    assert len(again.token_ids) <= 5 and live == 0
