"""The official `openai` client against `traingym serve` on a checkpoint of the tiny preset
(2 training steps), served by a real uvicorn subprocess (conftest.py).

Covered: the models list, chat (greedy text equal to a reference greedy decode of the
checkpoint's weights by transformers), streaming (the same text as the plain answer, ending
in `data: [DONE]`), log-probs with top_logprobs (equal to the reference log-softmax), n=2
with a seed (reproducible, two different samples), stop strings, a tool-call round trip, and
16 concurrent requests each answered as when sent alone (and decoded together: continuous
batching on the built-in engine, tests/serve/test_continuous.py).
"""

import asyncio
import json

import httpx
import pytest
import torch
from prereq import require
from safetensors.torch import load_model

from traingym.envs.tools import tools_system_prompt
from traingym.models.loader import load_policy

OPENAI = "the official openai client (test extra) is not installed"
PROMPT = [{"role": "user", "content": "What is 2 + 3?"}]


@pytest.fixture(scope="module")
def client(ckpt_server):
    openai = require("openai", OPENAI)
    return openai.OpenAI(base_url=ckpt_server.url + "/v1", api_key="unused", max_retries=0,
                         timeout=120)


@pytest.fixture(scope="module")
def reference(tiny_checkpoint):
    """The checkpoint's model and tokenizer, loaded here with transformers alone."""
    model, tok = load_policy("tiny", seed=0)
    untrained = {k: v.clone() for k, v in model.state_dict().items()}
    load_model(model, str(tiny_checkpoint / "model.safetensors"))
    assert any(not torch.equal(untrained[k], v) for k, v in model.state_dict().items()), \
        "the checkpoint should hold trained weights"
    return model.eval(), tok


def greedy(reference, text: str, k: int):
    """(ids, log-probs, top-3 per step) of k greedy tokens after `text`."""
    model, tok = reference
    ids = tok(text, add_special_tokens=False)["input_ids"]
    out, lps, tops = [], [], []
    with torch.no_grad():
        for _ in range(k):
            lp = model(torch.tensor([ids + out])).logits[0, -1].float().log_softmax(-1)
            t = int(lp.argmax())
            out.append(t)
            lps.append(float(lp[t]))
            tops.append(torch.topk(lp, 3))
            if t == tok.eos_token_id:
                break
    return out, lps, tops


def chat_text(tok, messages):
    return tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)


def test_models_list(client, ckpt_server):
    models = client.models.list().data
    assert [m.id for m in models] == ["tinyrun/step_000002"] == [ckpt_server.model]


def test_chat_greedy_matches_reference_with_logprobs(client, ckpt_server, reference):
    r = client.chat.completions.create(model=ckpt_server.model, messages=PROMPT, max_tokens=12,
                                       temperature=0, logprobs=True, top_logprobs=3)
    ids, lps, tops = greedy(reference, chat_text(reference[1], PROMPT), 12)
    body = [t for t in ids if t != reference[1].eos_token_id]
    c = r.choices[0]
    assert c.message.content == reference[1].decode(body)
    assert c.finish_reason == ("stop" if len(body) < len(ids) else "length")
    assert r.usage.completion_tokens == len(ids)
    assert r.usage.prompt_tokens == len(reference[1](chat_text(reference[1], PROMPT),
                                                     add_special_tokens=False)["input_ids"])
    entries = c.logprobs.content
    assert len(entries) == len(body)
    for e, lp, top in zip(entries, lps, tops):
        assert e.logprob == pytest.approx(lp, abs=1e-4)
        assert [t.logprob for t in e.top_logprobs] == pytest.approx(top.values.tolist(), abs=1e-4)
        assert [t.token for t in e.top_logprobs] == [reference[1].decode([i]) for i in
                                                     top.indices.tolist()]
        assert e.top_logprobs[0].logprob == pytest.approx(e.logprob)  # greedy: the best one


def test_streaming_equals_plain_answer(client, ckpt_server):
    args = dict(model=ckpt_server.model, messages=PROMPT, max_tokens=10, temperature=0.8,
                seed=11)
    plain = client.chat.completions.create(**args).choices[0]
    chunks = list(client.chat.completions.create(**args, stream=True,
                                                 stream_options={"include_usage": True}))
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert text == plain.message.content
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == plain.finish_reason
    assert chunks[-1].usage.completion_tokens > 0
    raw = httpx.post(ckpt_server.url + "/v1/chat/completions", json={**args, "stream": True},
                     timeout=120)
    assert raw.headers["content-type"].startswith("text/event-stream")
    assert raw.text.rstrip().endswith("data: [DONE]")


def test_n2_seeded_samples(client, ckpt_server):
    args = dict(model=ckpt_server.model, messages=PROMPT, max_tokens=12, temperature=1.0,
                n=2, seed=5, logprobs=True)
    a = client.chat.completions.create(**args)
    b = client.chat.completions.create(**args)
    texts = [c.message.content for c in a.choices]
    assert [c.index for c in a.choices] == [0, 1]
    assert texts == [c.message.content for c in b.choices]  # same seed, same samples
    assert texts[0] != texts[1]  # two samples, not one sample twice
    for c in a.choices:
        assert all(e.logprob <= 0 for e in c.logprobs.content)


def test_completions_stop_string_and_logprobs(client, ckpt_server, reference):
    model, tok = reference
    full = client.completions.create(model=ckpt_server.model, prompt="What is 2 + 3?",
                                     max_tokens=12, temperature=0, logprobs=2)
    text = full.choices[0].text
    assert text == tok.decode([t for t in greedy(reference, "What is 2 + 3?", 12)[0]
                               if t != tok.eos_token_id])
    assert len(full.choices[0].logprobs.tokens) == len(full.choices[0].logprobs.top_logprobs)
    stop = text[len(text) // 2:][:2]
    assert stop.strip(), f"need a non-blank stop string from {text!r}"
    cut = client.completions.create(model=ckpt_server.model, prompt="What is 2 + 3?",
                                    max_tokens=12, temperature=0, stop=[stop])
    assert cut.choices[0].text == text[:text.find(stop)]
    assert cut.choices[0].finish_reason == "stop"


ADD_TOOL = {"type": "function", "function": {
    "name": "add", "description": "Add two integers.",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer"},
                                                    "b": {"type": "integer"}},
                   "required": ["a", "b"]}}}


def test_tool_call_round_trip(client, ckpt_server, reference):
    """What this proves, given that the tiny model never writes a tool call by itself:
    1. parse: the assistant turn is pre-filled (continue_final_message, a vLLM extension)
       with a Hermes `<tool_call>` block; the server parses pre-fill + completion with
       envs/tools.py's parser and answers an OpenAI `tool_calls` entry (name, JSON
       arguments, an id) with finish_reason 'tool_calls', exactly as a model-written call;
    2. render: the client's assistant `tool_calls` message and the `tool` result message go
       back into the prompt through the chat template: the chat answer equals a greedy
       completion of the prompt written out here by hand (tools in the Hermes system message,
       the call as `<tool_call>` text, the result as a `tool` turn), and its prompt_tokens
       equal that prompt's length. Not proved: that a model chooses to call tools."""
    model, tok = reference
    call = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
    first = client.chat.completions.create(
        model=ckpt_server.model, tools=[ADD_TOOL], temperature=0, max_tokens=2,
        messages=PROMPT + [{"role": "assistant", "content": call}],
        extra_body={"continue_final_message": True})
    msg = first.choices[0].message
    assert first.choices[0].finish_reason == "tool_calls"
    assert [(c.function.name, json.loads(c.function.arguments)) for c in msg.tool_calls] == \
        [("add", {"a": 2, "b": 3})]
    assert msg.tool_calls[0].id and msg.tool_calls[0].type == "function"

    messages = PROMPT + [msg.model_dump(exclude_none=True),
                         {"role": "tool", "tool_call_id": msg.tool_calls[0].id, "content": "5"}]
    second = client.chat.completions.create(model=ckpt_server.model, tools=[ADD_TOOL],
                                            messages=messages, temperature=0, max_tokens=8)
    # the text the model wrote besides the call (2 tokens of the tiny model) stays content;
    # the template gets it first, then the call as text
    said = msg.content + "\n" if msg.content else ""
    by_hand = ("<|im_start|>system\n" + tools_system_prompt([ADD_TOOL]) + "<|im_end|>\n"
               "<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n"
               "<|im_start|>assistant\n" + said + call + "<|im_end|>\n"
               "<|im_start|>tool\n5<|im_end|>\n<|im_start|>assistant\n")
    assert second.usage.prompt_tokens == len(tok(by_hand, add_special_tokens=False)["input_ids"])
    plain = client.completions.create(model=ckpt_server.model, prompt=by_hand, temperature=0,
                                      max_tokens=8)
    assert second.choices[0].message.content == plain.choices[0].text
    assert second.choices[0].message.tool_calls is None


def test_16_concurrent_requests_equal_alone(ckpt_server):
    """16 different requests at once (greedy and seeded sampling) get the same answers as
    each sent alone, and the server did batch them (several requests in one engine call)."""
    openai = require("openai", OPENAI)
    reqs = [dict(model=ckpt_server.model, max_tokens=8 + i % 5, seed=i,
                 temperature=0 if i % 2 else 0.9,
                 messages=[{"role": "user", "content": f"What is {i} + {i + 3}?"}])
            for i in range(16)]

    async def answers(together: bool):
        client = openai.AsyncOpenAI(base_url=ckpt_server.url + "/v1", api_key="unused",
                                    max_retries=0, timeout=300)
        if together:
            rs = await asyncio.gather(*(client.chat.completions.create(**r) for r in reqs))
        else:
            rs = [await client.chat.completions.create(**r) for r in reqs]
        return [(c.choices[0].message.content, c.choices[0].finish_reason) for c in rs]

    before = httpx.get(ckpt_server.url + "/health").json()["batching"]
    together = asyncio.run(answers(True))
    after = httpx.get(ckpt_server.url + "/health").json()["batching"]
    alone = asyncio.run(answers(False))
    last = httpx.get(ckpt_server.url + "/health").json()["batching"]
    assert together == alone
    assert all(text for text, _ in together)
    if after["mode"] == "continuous":  # the built-in engine: rows decoded together per step
        steps, steps_alone = after["steps"] - before["steps"], last["steps"] - after["steps"]
        assert steps < steps_alone / 2, f"together {steps} decode steps, alone {steps_alone}"
    else:
        calls = after["engine_calls"] - before["engine_calls"]
        assert calls < 16, f"16 concurrent requests took {calls} engine calls: nothing was batched"
