"""A LoRA run (trainer/lora.py) through eval and export: its checkpoint holds the adapter-injected
state, which eval and export merge into the base (eval/specs.py load_weights). --compare base RUN
reproduces the run's before/after exactly (the merged weights are what its engine served with
lora.sync='merged'), and the exported folder's logits equal the engine's on those weights."""

from __future__ import annotations

import json

import pytest
import torch

import traingym
from traingym.cli import main


@pytest.mark.parametrize("base_dtype", ["float32", "bfloat16"])
def test_lora_run_compare_and_export(tmp_path, base_dtype):
    """With a bf16 base (lora.base_dtype) the checkpoint's bf16 base upcasts exactly, so the
    trained side still matches; the run's 'before' scored the bf16-rounded base, --compare's
    'base' the float32 folder, so only the float32 run's delta is compared."""
    cfg = traingym.build_config("tiny", overrides={
        "steps": 2, "lora": {"rank": 4, "alpha": 8.0, "target_modules": ["q_proj", "v_proj"],
                             "base_dtype": base_dtype},
        "trainer": {"lr": 1e-2, "bf16_autocast": base_dtype == "bfloat16"}})
    run = tmp_path / "run"
    traingym.train(cfg, run_dir=run, progress=False)
    assert main(["eval", "--compare", "base", str(run), "--out", str(tmp_path / "cmp")]) == 0
    res = json.loads((tmp_path / "cmp" / "compare.json").read_text())
    report = json.loads((run / "results.json").read_text())["eval"]
    for metric in ("greedy", "sampled"):
        if base_dtype == "float32":
            assert res["delta"][metric] == report["delta"][metric]
        assert res["b_scores"][metric] == report["after"][metric]

    from transformers import AutoModelForCausalLM

    from traingym.config.load import run_config
    from traingym.eval.specs import build_engine_for, resolve_spec

    assert main(["export", str(run), str(tmp_path / "hf")]) == 0
    hf = AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    assert not any("lora" in k for k in hf.state_dict())
    engine, tok = build_engine_for(run_config(run), resolve_spec(run))
    ids = torch.tensor([tok.encode("What is 2 + 2? The answer is")])
    with torch.no_grad():
        assert torch.equal(hf(ids).logits, engine.model(ids).logits)
        base = AutoModelForCausalLM.from_pretrained(tmp_path / "hf")  # trained: not the base
        from traingym.models.loader import load_policy

        untrained, _ = load_policy("tiny", seed=0)
        assert not torch.equal(untrained(ids).logits, base(ids).logits)
