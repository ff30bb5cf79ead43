"""The SGLang engine on a GPU: a real SGLang server started by the engine, serving the embedded
SmolLM2-135M in bf16 ($TRAINGYM_GPU_MODEL: 'embedded' by default, 'tiny' or a model folder).
Skipped without a CUDA device (tests/gpu/conftest.py) or without sglang in
$TRAINGYM_SGLANG_PYTHON (default: this interpreter); scripts/gpu_check.sh runs it.

Checked: generation with log-probs against a Hugging Face forward of the same tokens in bf16 on
the same GPU (tolerance: mean |diff| <= 0.05 and max <= 0.5 nats per token; bf16 kernels differ),
stop tokens; a full then a delta update through weights/colocated.ColocatedSync, hash-verified,
changing the greedy outputs and changing them back; a 2-step sync training run with
rollout.engine="sglang". Measured figures (log-prob differences, each update's write/load
seconds, the run's per-step engine update seconds) go to $TRAINGYM_GPU_RESULTS/gpu_sglang.json
(default: a new file in benchmarks/results/gpu_sglang/).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from traingym.core.types import GenerationRequest, SamplingParams

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parents[2]
RESULTS: dict = {}
LP_MEAN, LP_MAX = 0.05, 0.5
MODEL = os.environ.get("TRAINGYM_GPU_MODEL") or "embedded"  # or 'tiny', or a model folder


def sglang_python() -> str:
    py = os.environ.get("TRAINGYM_SGLANG_PYTHON") or sys.executable
    ok = subprocess.run([py, "-c", "import importlib.util as u, sys; "
                         "sys.exit(u.find_spec('sglang') is None)"], capture_output=True)
    if ok.returncode != 0:
        pytest.skip(f"sglang is not installed in {py} (set TRAINGYM_SGLANG_PYTHON)")
    return py


@pytest.fixture(scope="module")
def setup():
    from traingym.config.load import build_config
    from traingym.envs.render import PromptRenderer
    from traingym.envs.tasks import builtin_task
    from traingym.models.loader import load_policy

    py = sglang_python()
    model, tok = load_policy(MODEL)
    cfg = build_config(overrides={
        "model": {"path": MODEL, "engine_dtype": "bfloat16"},
        "rollout": {"engine": "sglang", "engine_options": {"python": py,
                                                           "mem_fraction_static": 0.3}},
        "weights": {"codec": "delta"}})
    rows = builtin_task("arith").heldout[:8]
    prompts = [PromptRenderer(tok, prefill="The answer is").ids(r) for r in rows]
    yield cfg, model.eval(), tok, prompts
    RESULTS.update(device=torch.cuda.get_device_name(0), model=MODEL)
    # a new result file per run (benchmarks/resultfile.py), or TRAINGYM_GPU_RESULTS/FILE.json
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import resultfile

    out = os.environ.get("TRAINGYM_GPU_RESULTS")
    resultfile.Recorder("gpu_sglang", out=str(Path(out) / "gpu_sglang.json") if out else None
                        ).write(RESULTS)


@pytest.fixture(scope="module")
def engine(setup):
    from traingym.rollout import registry

    cfg, model, tok, _ = setup
    t0 = time.perf_counter()
    from traingym.config.engines import engine_context

    eng, _ = registry.build(engine_context(cfg), model, tok)
    RESULTS["start_s"] = time.perf_counter() - t0
    yield eng
    eng.close()


def greedy(eng, prompts, tok):
    params = SamplingParams(0, max_new_tokens=12, stop_token_ids=(tok.eos_token_id,))
    out = asyncio.run(eng.generate([GenerationRequest(p, 1, params) for p in prompts]))
    return [cs[0].token_ids for cs in out]


def test_generation_logprobs_match_a_hf_forward(setup, engine):
    _, model, tok, prompts = setup
    ref = model.to("cuda", torch.bfloat16)
    diffs = []
    try:
        for temp in (0.0, 1.0):
            params = SamplingParams(temp, max_new_tokens=12, stop_token_ids=(tok.eos_token_id,))
            out = asyncio.run(engine.generate([GenerationRequest(p, 2, params, seed=i)
                                               for i, p in enumerate(prompts)]))
            for comps in out:
                assert len(comps) == 2
                for c in comps:
                    assert 1 <= len(c.token_ids) == len(c.logprobs) <= 12
                    assert c.finish_reason == ("stop" if c.token_ids[-1] == tok.eos_token_id
                                               else "length")
                    ids = torch.tensor([list(c.prompt_ids) + c.token_ids], device="cuda")
                    with torch.no_grad():
                        lg = ref(input_ids=ids).logits[0, len(c.prompt_ids) - 1: -1].float()
                    want = (lg / (temp or 1.0)).log_softmax(-1).gather(
                        -1, torch.tensor(c.token_ids, device="cuda")[:, None])[:, 0].cpu()
                    diffs.append((want - torch.tensor(c.logprobs)).abs())
    finally:
        model.to("cpu", torch.float32)
    d = torch.cat(diffs)
    RESULTS["logprob_abs_diff"] = {"mean": d.mean().item(), "max": d.max().item(),
                                   "tokens": d.numel()}
    assert d.mean().item() <= LP_MEAN and d.max().item() <= LP_MAX, RESULTS["logprob_abs_diff"]


def test_full_and_delta_updates_are_verified_and_change_outputs(setup, engine, tmp_path):
    from traingym.weights.colocated import ColocatedSync, wire_state
    from traingym.weights.hashing import state_hash

    cfg, model, tok, prompts = setup
    before = greedy(engine, prompts, tok)
    base = {k: v.detach().clone() for k, v in model.state_dict().items()}
    g = torch.Generator().manual_seed(0)
    noisy = {k: (v + 0.05 * torch.randn(v.shape, generator=g) if v.dim() == 2 else v)
             for k, v in base.items()}
    sync = ColocatedSync(engine, cfg.weights, torch.bfloat16, tmp_path / "sync")
    try:
        full = sync.publish(noisy, 1)
        assert full.codec == "full" and engine.version == 1
        assert engine.state_hash() == state_hash(wire_state(noisy, torch.bfloat16))
        changed = greedy(engine, prompts, tok)
        assert sum(a != b for a, b in zip(before, changed)) >= 6
        delta = sync.publish(base, 2)
        assert delta.codec == "delta" and engine.version == 2
        assert engine.state_hash() == state_hash(wire_state(base, torch.bfloat16))
        back = greedy(engine, prompts, tok)
        assert sum(a == b for a, b in zip(before, back)) >= 7
    finally:
        sync.close()
    RESULTS["updates"] = engine.update_times
    RESULTS["codecs"] = [full.codec, delta.codec]


def test_short_sync_training_run_on_sglang(setup):
    import traingym

    cfg, *_ = setup
    overrides = {"steps": 2, "rollout": {"engine": "sglang", "engine_options": dict(
        cfg.rollout.engine_options), "prompts_per_step": 4, "group_size": 4,
        "max_new_tokens": 8}, "model": {"path": MODEL, "engine_dtype": "bfloat16"},
        "eval": {"num_prompts": 16, "samples_per_prompt": 2}}
    t0 = time.perf_counter()
    result = traingym.train(traingym.build_config(overrides=overrides))
    seconds = time.perf_counter() - t0
    events = [json.loads(line) for line in (Path(result.run_dir) / "events.jsonl").open()]
    steps = [e for e in events if "sync_engine_s" in e]
    assert len(steps) == 2 and all(e["sync_version"] == e["step"] for e in steps)
    RESULTS["train_run"] = {"seconds": seconds, "sync_engine_s": [e["sync_engine_s"]
                                                                  for e in steps],
                            "reward_mean": [e["reward_mean"] for e in steps]}
