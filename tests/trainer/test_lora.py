"""LoRA: adapters only are trained; merged export; adapter-only sync serves the same bits as
merged sync (fp32 engine); resume is exact."""

import json

import pytest
import torch
from prereq import require
from safetensors.torch import load_file

require("peft", "LoRA needs peft (the lora extra: pip install traingym[lora])")

import traingym  # noqa: E402
from traingym.models.loader import tiny_model, tiny_tokenizer  # noqa: E402
from traingym.models.lora import adapter_state, apply_lora, merged_state
from traingym.observability.events import read_events  # noqa: E402
from traingym.trainer.config import LoraConfig  # noqa: E402


def _cfg(steps, **lora):
    return traingym.build_config("tiny", overrides={
        "steps": steps, "checkpoint": {"every": 2}, "eval": {"before": False, "after": False},
        "trainer": {"lr": 1e-2}, "lora": {"rank": 4, "alpha": 8.0, **lora}})


def test_only_adapters_train_and_merge_is_base_plus_scaled_ba():
    tok = tiny_tokenizer()
    base = tiny_model(tok, seed=1)
    before = {k: v.clone() for k, v in base.state_dict().items()}
    model = apply_lora(tiny_model(tok, seed=1), LoraConfig(rank=2, alpha=6.0))
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all(".lora_" in n for n in trainable)
    merged = merged_state(model)
    assert merged.keys() == before.keys()
    for k in before:  # B starts at zero: the merge is the base
        assert torch.equal(merged[k], before[k]), k
    layer = model.model.layers[0].self_attn.q_proj
    with torch.no_grad():
        layer.lora_B["default"].weight.normal_()
    merged = merged_state(model)
    a, b = layer.lora_A["default"].weight, layer.lora_B["default"].weight
    expect = before["model.layers.0.self_attn.q_proj.weight"] + 3.0 * (b @ a)
    assert torch.allclose(merged["model.layers.0.self_attn.q_proj.weight"], expect, atol=1e-6)
    adapters = adapter_state(model)
    assert len(adapters) == 2 * 4 * 2  # A and B x 4 target modules x 2 layers
    assert all(".lora_A.weight" in k or ".lora_B.weight" in k for k in adapters)
    with pytest.raises(ValueError, match="name no linear layer"):
        apply_lora(tiny_model(tok), LoraConfig(rank=2, target_modules=["qkv"]))


def test_adapter_sync_serves_what_merged_sync_serves(tmp_path):
    merged = traingym.train(_cfg(3, sync="merged"), run_dir=tmp_path / "m", progress=False)
    adapter = traingym.train(_cfg(3, sync="adapter"), run_dir=tmp_path / "a", progress=False)
    em, ea = read_events(merged.run_dir), read_events(adapter.run_dir)
    assert any(e["groups_kept"] > 0 for e in em), "never trained: the test would be vacuous"
    # same samples and rewards at every step: the engines served the same weights
    assert [e["reward_mean"] for e in em] == [e["reward_mean"] for e in ea]
    assert [e["loss"] for e in em] == [e["loss"] for e in ea]
    # adapter-only sync moves far fewer bytes than the whole model
    full = em[-1]["sync_full_bytes"]
    assert ea[-1]["sync_full_bytes"] < full / 4
    # the base did not move: the checkpoint's frozen weights equal the initial model's
    ck = load_file(adapter.run_dir / "checkpoints/step_000003/model.safetensors")
    init = tiny_model(tiny_tokenizer(), seed=0).state_dict()
    w = "model.layers.0.self_attn.q_proj"
    assert torch.equal(ck[f"{w}.base_layer.weight"], init[f"{w}.weight"])
    assert not torch.equal(ck[f"{w}.lora_B.default.weight"],
                           torch.zeros_like(ck[f"{w}.lora_B.default.weight"]))


def test_lora_resume_is_exact(tmp_path):
    traingym.train(_cfg(4), run_dir=tmp_path / "s", progress=False)
    traingym.train(_cfg(2), run_dir=tmp_path / "r", progress=False)
    traingym.train(_cfg(4), run_dir=tmp_path / "r", resume=True, progress=False)
    a, b = tmp_path / "s/checkpoints/step_000004", tmp_path / "r/checkpoints/step_000004"
    for name in ("model.safetensors", "optimizer.safetensors"):
        ta, tb = load_file(a / name), load_file(b / name)
        assert ta.keys() == tb.keys()
        assert all(torch.equal(ta[k], tb[k]) for k in ta), name
    opt = json.loads((a / "optimizer.json").read_text())
    n_adapters = sum(1 for k in load_file(a / "model.safetensors") if ".lora_" in k)
    assert len(opt["param_groups"][0]["params"]) == n_adapters  # AdamW over adapters only
