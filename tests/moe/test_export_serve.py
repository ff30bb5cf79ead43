"""A tiny Qwen3-MoE and a tiny Mixtral run (tests/moe_tiny.py, 2 steps, the built-in engine)
through `traingym export` and `traingym serve`.

Covered: the exported folder loads with transformers' AutoModelForCausalLM, its logits equal
(bitwise) the checkpoint loaded into the run's own model and differ from the base model's (the
trained weights went out); `traingym serve` on the run directory and on the exported folder
answers /v1/completions with transformers' greedy completion of the exported model, and
/v1/chat/completions.
Not covered: vLLM loading the export (tests/eval/test_export.py does it for a dense model),
sharded or bf16 exports of MoE models.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch
from moe_tiny import save_tiny_moe  # tests/ is on sys.path (tests/conftest.py)

import traingym
from traingym.cli import main

PROMPT = "What is 2 + 2?"


def _server_class():
    """tests/serve/conftest.py's Server (a real `traingym serve` subprocess)."""
    spec = importlib.util.spec_from_file_location(
        "serve_conftest", Path(__file__).parents[1] / "serve" / "conftest.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.Server


@pytest.fixture(scope="module", params=["qwen3_moe", "mixtral"])
def exported(request, tmp_path_factory):
    """(run dir, exported folder, base folder) of a 2-step run of the family's tiny MoE."""
    root = tmp_path_factory.mktemp(request.param)
    base = save_tiny_moe(root / "base", request.param)
    cfg = traingym.build_config("tiny", overrides={
        "steps": 2, "threads": 1, "model": {"path": base},
        "eval": {"before": False, "after": False}})
    traingym.train(cfg, run_dir=root / "run", progress=False)
    assert main(["export", str(root / "run"), str(root / "hf")]) == 0
    return root / "run", root / "hf", base


def test_export_loads_in_transformers_with_the_trained_logits(exported):
    from transformers import AutoModelForCausalLM

    from traingym.config.load import run_config
    from traingym.eval.specs import load_weights, resolve_spec
    from traingym.models.loader import load_policy

    run_dir, folder, base = exported
    hf = AutoModelForCausalLM.from_pretrained(folder).eval()
    spec = resolve_spec(run_dir)
    cfg = run_config(spec.run_dir)
    model, _ = load_policy(cfg.model.path, seed=cfg.seed)
    load_weights(model, cfg, spec.checkpoint)
    ids = torch.tensor([[5, 9, 30, 7, 100, 3, 42]])
    with torch.no_grad():
        got, want = hf(ids).logits, model.eval()(ids).logits
        start = AutoModelForCausalLM.from_pretrained(base).eval()(ids).logits
    assert type(hf).__name__ == type(model).__name__
    assert torch.equal(got, want)
    assert (got - start).abs().max() > 1e-3  # the trained weights, not the base's


def test_serve_answers_with_the_exported_models_greedy_completion(exported, tmp_path):
    import httpx
    from transformers import AutoModelForCausalLM, AutoTokenizer

    run_dir, folder, _ = exported
    tok = AutoTokenizer.from_pretrained(folder)
    hf = AutoModelForCausalLM.from_pretrained(folder).eval()
    ids = tok(PROMPT, return_tensors="pt").input_ids
    with torch.no_grad():
        out = hf.generate(ids, max_new_tokens=5, do_sample=False,
                          eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    want = tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
    Server = _server_class()
    for target in (run_dir, folder):
        server = Server(str(target), log=tmp_path / f"{target.name}.log")
        try:
            r = httpx.post(server.url + "/v1/completions", timeout=120, json={
                "model": server.model, "prompt": PROMPT, "max_tokens": 5, "temperature": 0})
            assert r.status_code == 200, r.text
            assert r.json()["choices"][0]["text"] == want, (target, r.json())
            r = httpx.post(server.url + "/v1/chat/completions", timeout=120, json={
                "model": server.model, "max_tokens": 4,
                "messages": [{"role": "user", "content": PROMPT}]})
            assert r.status_code == 200, r.text
            assert r.json()["choices"][0]["message"]["role"] == "assistant"
        finally:
            assert server.stop() == 0
