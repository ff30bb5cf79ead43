"""`traingym serve` under hostile traffic: memory over rounds of refused requests, and whether
a body over --max-body-bytes gets its 413 or a connection reset.

Starts `traingym serve MODEL` (default: tiny, default limits) as a subprocess and sends
--rounds identical rounds of ~60 requests the server must refuse: malformed JSON, wrong types,
unknown model, huge max_tokens and n, prompts of ~900 KB (under the 1 MiB body limit, far over
--max-prompt-tokens) as chat, completion text, token ids and many messages, JSON nested 500k
deep, and 3 MB bodies sent in full (with Content-Length and chunked). After each round it reads
the server's VmRSS and VmHWM (peak) from /proc. Per round: RSS, growth, statuses seen, and
transport errors (a reset or broken pipe where a 413 was due counts here). Writes one JSON
result file (benchmarks/results/serve_hostile/). PYTHONPATH=OTHER/src measures another
checkout's server (label it: --label before).

    .venv/bin/python benchmarks/serve_hostile.py [--model tiny] [--rounds 3]
        [--env MALLOC_ARENA_MAX=2] [--label L | --out /tmp/serve_hostile.json]
"""

from __future__ import annotations

import argparse
import collections
import itertools
import json
import os
import socket
import sys
import time

import resultfile
from serving import serving

C, P = "/v1/chat/completions", "/v1/completions"
BIG = 3_000_000  # bytes: a body well over the default 1 MiB limit
LONG = "1 + 2 " * 150_000  # 900 KB of text: under the body limit, ~300k+ tokens


def hostile(model: str) -> list[tuple[str, str, bytes | None, int]]:
    """(name, path, body, expected status); body None: a PUT with no body."""
    def chat(**kw):
        return json.dumps({"model": model, "max_tokens": 4, "messages": [
            {"role": "user", "content": "What is 1 + 2?"}], **kw}).encode()

    def comp(**kw):
        return json.dumps({"model": model, "prompt": "1 + 2", "max_tokens": 4, **kw}).encode()

    small = [
        ("malformed json", C, b'{"model": "x", "messages": [', 400),
        ("json not an object", C, b"[1, 2]", 400),
        ("not utf-8", C, b"\xff\xfe{}", 400),
        ("empty body", C, b"", 400),
        ("missing messages", C, json.dumps({"model": model}).encode(), 400),
        ("messages not a list", C, chat(messages="hi"), 400),
        ("unknown role", C, chat(messages=[{"role": "robot", "content": "x"}]), 400),
        ("content a number", C, chat(messages=[{"role": "user", "content": 5}]), 400),
        ("unknown model", C, chat(model="gpt-9"), 404),
        ("max_tokens a string", C, chat(max_tokens="many"), 400),
        ("huge max_tokens", C, chat(max_tokens=10**12), 400),
        ("huge max_tokens completion", P, comp(max_tokens=10**12), 400),
        ("n huge", C, chat(n=10**9), 400),
        ("negative temperature", C, chat(temperature=-1), 400),
        ("unknown field", C, chat(frobnicate=True), 400),
        ("tool_choice required", C, chat(tool_choice="required"), 400),
        ("token id out of range", P, comp(prompt=[1, 2, 10**12]), 400),
        ("negative token id", P, comp(prompt=[-1]), 400),
        ("unknown route", "/v1/embeddings", chat(), 404),
        ("wrong method", "/v1/models", None, 405),
    ]
    big = [
        ("long chat prompt", C, chat(messages=[{"role": "user", "content": LONG}]), 400),
        ("long chat prompt, unknown model", C,
         chat(model="gpt-9", messages=[{"role": "user", "content": LONG}]), 404),
        ("many messages", C, chat(messages=[{"role": "user", "content": "1 + 2"}] * 20_000), 400),
        ("long completion prompt", P, comp(prompt=LONG), 400),
        ("many completion prompts", P, comp(prompt=["1 + 2 " * 100] * 1500), 400),
        ("long token-id prompt", P, comp(prompt=[5] * 300_000), 400),
        ("deep nesting", C, b"[" * 500_000, 400),
        ("oversize body", C, chat(messages=[{"role": "user", "content": "x" * BIG}]), 413),
        ("oversize body, chunked", C, chat(messages=[{"role": "user", "content": "y" * BIG}]),
         413),
    ]
    return small * 2 + big * 2


def send_raw(port: int, path: str, body: bytes, chunked: bool) -> tuple[int, str]:
    """POST `body` in full in 64 KB writes, then read the answer to the end, on a socket of
    its own (httpx and requests read an answer after a failed write; urllib and most raw
    clients raise on the reset, as this does)."""
    size = "Transfer-Encoding: chunked" if chunked else f"Content-Length: {len(body)}"
    with socket.create_connection(("127.0.0.1", port), timeout=120) as s:
        s.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  f"{size}\r\n\r\n".encode())
        for i in range(0, len(body), 65536):
            part = body[i:i + 65536]
            s.sendall(b"%x\r\n%s\r\n" % (len(part), part) if chunked else part)
        s.sendall(b"0\r\n\r\n" if chunked else b"")
        answer = b""
        while chunk := s.recv(65536):
            answer += chunk
    head, _, data = answer.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(data)["error"]["message"]


def send(client, port: int, name: str, path: str, body: bytes | None):
    import httpx

    url = f"http://127.0.0.1:{port}"
    try:
        if body is None:
            r = client.put(url + path)
        elif "oversize" in name:
            return send_raw(port, path, body, "chunked" in name)
        else:
            r = client.post(url + path, content=body,
                            headers={"content-type": "application/json"})
        return r.status_code, r.json().get("error", {}).get("message", "")
    except (httpx.TransportError, OSError) as e:
        return f"{type(e).__name__}", str(e)


def vm(pid: int) -> dict[str, float]:
    """VmRSS and VmHWM (peak) of `pid`, in MB."""
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(("VmRSS:", "VmHWM:")):
                out[line.split(":")[0]] = int(line.split()[1]) / 1024
    return out


def main() -> int:
    import httpx

    p = argparse.ArgumentParser()
    p.add_argument("--model", default="tiny")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                   help="set in the server's environment, e.g. MALLOC_ARENA_MAX=2")
    resultfile.add_args(p)
    a = p.parse_args()
    rec = resultfile.start("serve_hostile", a)
    env = {**os.environ, "OMP_NUM_THREADS": "1", **dict(kv.split("=", 1) for kv in a.env)}
    rounds, mismatches = [], []
    with serving(a.model, env=env, prefix="serve_hostile_") as server:
        url, port, model = server.url, server.port, server.model
        good = {"model": model, "max_tokens": 4, "messages": [{"role": "user",
                                                              "content": "What is 1 + 2?"}]}
        with httpx.Client(timeout=120) as client:
            client.post(url + C, json=good).raise_for_status()
            start = vm(server.proc.pid)
            reqs = hostile(model)
            for k in range(a.rounds):
                t0, seen = time.perf_counter(), collections.Counter()
                for name, path, body, want in reqs:
                    got, msg = send(client, port, name, path, body)
                    seen[str(got)] += 1
                    if got != want and k == 0:
                        mismatches.append({"name": name, "want": want, "got": got,
                                           "message": msg[:200]})
                ok = client.post(url + C, json=good).status_code == 200
                rounds.append({"round": k + 1, "requests": len(reqs),
                               "seconds": round(time.perf_counter() - t0, 2),
                               "rss_mb": round(vm(server.proc.pid)["VmRSS"], 1),
                               "peak_rss_mb": round(vm(server.proc.pid)["VmHWM"], 1),
                               "statuses": dict(seen), "good_request_after_ok": ok})
                print(json.dumps(rounds[-1]), file=sys.stderr, flush=True)
    code = server.exit_code
    rss = [start["VmRSS"]] + [r["rss_mb"] for r in rounds]
    result = {
        "model": a.model, "server_env": a.env, "rounds": a.rounds,
        "requests_per_round": len(reqs), "rss_after_warmup_mb": round(start["VmRSS"], 1),
        "per_round": rounds,
        "growth_per_round_mb": [round(y - x, 1) for x, y in itertools.pairwise(rss)],
        "growth_after_first_round_mb": round(rss[-1] - rss[1], 1) if len(rss) > 2 else None,
        "unexpected_answers": mismatches,
        "transport_errors": sum(n for r in rounds for s, n in r["statuses"].items()
                                if not s.isdigit()),
        "server_exit_code": code, "server_log": server.log,
    }
    rec.write(result)
    print(json.dumps({k: result[k] for k in ("growth_per_round_mb", "transport_errors",
                                             "unexpected_answers")}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
