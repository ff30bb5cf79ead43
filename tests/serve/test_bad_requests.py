"""At least 30 bad requests against one `traingym serve tiny` with small limits and an API
key: each is answered 4xx in the OpenAI error shape with a message (or, for an abrupt
disconnect, the stream is simply closed), and after every one the server still answers a good
request. Then the concurrency limit (429) and, at the end, no request slot is left held."""

import asyncio
import json
import socket

import httpx
import pytest
from conftest import Server

KEY = "test-key-123"
AUTH = {"Authorization": f"Bearer {KEY}"}
LIMITS = ["--max-tokens", "64", "--max-prompt-tokens", "120", "--max-body-bytes", "20000",
          "--max-n", "4", "--max-concurrent", "4", "--api-key-env", "SERVE_KEY"]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    s = Server("tiny", *LIMITS, env={"SERVE_KEY": KEY},
               log=tmp_path_factory.mktemp("log") / "serve.log")
    yield s
    assert s.stop() == 0


def chat(**kw):
    return {"model": "tiny", "messages": [{"role": "user", "content": "What is 1 + 2?"}],
            "max_tokens": 4, **kw}


def comp(**kw):
    return {"model": "tiny", "prompt": "What is 1 + 2?", "max_tokens": 4, **kw}


C, P = "/v1/chat/completions", "/v1/completions"
BAD = [  # (name, path, body: dict | bytes, headers, expected status, word in the message)
    ("malformed json", C, b'{"model": "tiny", "messages": [', None, 400, "not valid JSON"),
    ("json not an object", C, b"[1, 2]", None, 400, "JSON object"),
    ("not utf-8", C, b"\xff\xfe{}", None, 400, "JSON"),
    ("empty body", C, b"", None, 400, "JSON"),
    ("missing messages", C, {"model": "tiny"}, None, 400, "messages"),
    ("messages not a list", C, chat(messages="hi"), None, 400, "messages"),
    ("empty messages", C, chat(messages=[]), None, 400, "messages"),
    ("message without role", C, chat(messages=[{"content": "x"}]), None, 400, "role"),
    ("unknown role", C, chat(messages=[{"role": "robot", "content": "x"}]), None, 400, "role"),
    ("content a number", C, chat(messages=[{"role": "user", "content": 5}]), None, 400, "content"),
    ("image part", C, chat(messages=[{"role": "user", "content": [{"type": "image_url"}]}]),
     None, 400, "text parts"),
    ("tool result for no call", C, chat(messages=[{"role": "user", "content": "x"}, {
        "role": "tool", "tool_call_id": "nope", "content": "1"}]), None, 400, "tool_call_id"),
    ("unknown model", C, chat(model="gpt-9"), None, 404, "gpt-9"),
    ("max_tokens a string", C, chat(max_tokens="many"), None, 400, "max_tokens"),
    ("huge max_tokens", C, chat(max_tokens=10**9), None, 400, "max_tokens"),
    ("max_tokens zero", C, chat(max_tokens=0), None, 400, "max_tokens"),
    ("negative temperature", C, chat(temperature=-1), None, 400, "temperature"),
    ("top_p above 1", C, chat(top_p=1.5), None, 400, "top_p"),
    ("n over the limit", C, chat(n=50), None, 400, "max_n"),
    ("n zero", C, chat(n=0), None, 400, "n"),
    ("over-long prompt", C, chat(messages=[{"role": "user", "content": "1 + 2 " * 200}]),
     None, 400, "max_prompt_tokens"),
    ("top_logprobs without logprobs", C, chat(top_logprobs=3), None, 400, "logprobs"),
    ("top_logprobs over 20", C, chat(logprobs=True, top_logprobs=50), None, 400, "top_logprobs"),
    ("five stop strings", C, chat(stop=["a", "b", "c", "d", "e"]), None, 400, "stop"),
    ("unknown field", C, chat(frobnicate=True), None, 400, "frobnicate"),
    ("penalty unsupported", C, chat(presence_penalty=0.5), None, 400, "presence_penalty"),
    ("tool not a function", C, chat(tools=[{"type": "retrieval"}]), None, 400, "tools"),
    ("tool with a bad name", C, chat(tools=[{"type": "function", "function": {"name": "a b!"}}]),
     None, 400, "name"),
    ("tool parameters not an object schema", C, chat(tools=[{"type": "function", "function": {
        "name": "f", "parameters": {"type": "string"}}}]), None, 400, "object"),
    ("bad tool_call arguments", C, chat(messages=[{"role": "user", "content": "x"}, {
        "role": "assistant", "tool_calls": [{"id": "1", "type": "function", "function": {
            "name": "f", "arguments": "{not json"}}]}]), None, 400, "arguments"),
    ("tool_choice required", C, chat(tool_choice="required"), None, 400, "tool_choice"),
    ("continue without assistant", C, chat(continue_final_message=True), None, 400,
     "continue_final_message"),
    ("completion prompt empty", P, comp(prompt=""), None, 400, "prompt"),
    ("completion token id out of range", P, comp(prompt=[1, 2, 10**7]), None, 400, "token"),
    ("completion echo", P, comp(echo=True), None, 400, "echo"),
    ("completion n x prompts over max_n", P, comp(prompt=["a", "b", "c"], n=2), None, 400,
     "max_n"),
    ("no key", C, chat(), {"Authorization": ""}, 401, "API key"),
    ("wrong key", C, chat(), {"Authorization": "Bearer wrong"}, 401, "wrong API key"),
    ("oversize body", C, chat(messages=[{"role": "user", "content": "x" * 30000}]), None, 413,
     "max_body_bytes"),
    ("unknown route", "/v1/embeddings", chat(), None, 404, "/v1/embeddings"),
    ("wrong method", "/v1/models", None, None, 405, "/v1/models"),
]


def good(server):
    r = httpx.post(server.url + C, json=chat(), headers=AUTH, timeout=120)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["role"] == "assistant"


@pytest.mark.parametrize("name,path,body,headers,status,word", BAD, ids=[b[0] for b in BAD])
def test_bad_request_then_good(server, name, path, body, headers, status, word):
    h = {k: v for k, v in {**AUTH, **(headers or {})}.items() if v}  # "": no header
    if body is None:
        r = httpx.put(server.url + path, headers=h, timeout=60)
    elif isinstance(body, bytes):
        r = httpx.post(server.url + path, content=body, timeout=60,
                       headers={**h, "content-type": "application/json"})
    else:
        r = httpx.post(server.url + path, json=body, headers=h, timeout=60)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert word.lower() in err["message"].lower(), err
    assert err["type"]
    good(server)


def test_count():
    assert len(BAD) + 3 >= 30  # and the three disconnect cases below


def _raw(server, body: dict) -> socket.socket:
    data = json.dumps(body).encode()
    s = socket.create_connection(("127.0.0.1", server.port), timeout=60)
    s.sendall(f"POST {C} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              f"Authorization: Bearer {KEY}\r\nContent-Length: {len(data)}\r\n\r\n".encode()
              + data)
    return s


def test_disconnect_mid_stream(server):
    s = _raw(server, chat(stream=True, max_tokens=60))
    first = s.recv(200)
    assert first.startswith(b"HTTP/1.1 200")
    s.close()  # abruptly, mid-stream
    good(server)


def test_disconnect_before_answer(server):
    _raw(server, chat(max_tokens=60)).close()
    good(server)


def test_disconnect_mid_body(server):
    s = socket.create_connection(("127.0.0.1", server.port), timeout=60)
    s.sendall(f"POST {C} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n"
              "Content-Length: 5000\r\n\r\n{\"model\"".encode())
    s.close()  # the body never arrives
    good(server)


def test_concurrency_limit_and_no_leaked_slots(server):
    async def burst():
        async with httpx.AsyncClient(timeout=300, headers=AUTH) as c:
            return await asyncio.gather(*(c.post(server.url + C, json=chat(max_tokens=60, seed=i))
                                          for i in range(12)))
    codes = [r.status_code for r in asyncio.run(burst())]
    assert set(codes) <= {200, 429} and 429 in codes and 200 in codes, codes
    busy = [r for r in asyncio.run(burst()) if r.status_code == 429]
    assert all("max_concurrent" in r.json()["error"]["message"] for r in busy)
    good(server)
    assert httpx.get(server.url + "/health", headers=AUTH).json()["in_flight"] == 0
