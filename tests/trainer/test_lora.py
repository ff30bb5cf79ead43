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
from traingym.models.lora import adapter_state, apply_lora, merged_state  # noqa: E402
from traingym.observability.events import read_events  # noqa: E402
from traingym.trainer.config import LoraConfig  # noqa: E402


def _cfg(steps, trainer=None, **lora):
    return traingym.build_config("tiny", overrides={
        "steps": steps, "checkpoint": {"every": 2}, "eval": {"before": False, "after": False},
        "trainer": {"lr": 1e-2, **(trainer or {})}, "lora": {"rank": 4, "alpha": 8.0, **lora}})


def _bf16(steps):  # a bf16 base computes in bf16: the trainer's autocast on (tiny has it off)
    return _cfg(steps, trainer={"bf16_autocast": True}, base_dtype="bfloat16")


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


def test_bf16_base_trains_resumes_exactly_and_keeps_the_base_frozen(tmp_path):
    """lora.base_dtype='bfloat16': the frozen base is bf16 (the initial model rounded), the
    adapters and AdamW's state fp32; resume is bitwise; the merge upcasts W to fp32."""
    traingym.train(_bf16(4), run_dir=tmp_path / "s", progress=False)
    traingym.train(_bf16(2), run_dir=tmp_path / "r", progress=False)
    traingym.train(_bf16(4), run_dir=tmp_path / "r", resume=True, progress=False)
    assert any(e["groups_kept"] > 0 for e in read_events(tmp_path / "s"))
    a, b = tmp_path / "s/checkpoints/step_000004", tmp_path / "r/checkpoints/step_000004"
    for name in ("model.safetensors", "optimizer.safetensors"):
        ta, tb = load_file(a / name), load_file(b / name)
        assert ta.keys() == tb.keys()
        assert all(torch.equal(ta[k], tb[k]) for k in ta), name
    ck = load_file(a / "model.safetensors")
    init = tiny_model(tiny_tokenizer(), seed=0).state_dict()
    for k, v in ck.items():
        if ".lora_" in k:
            assert v.dtype == torch.float32, k
        else:  # frozen: the initial weights rounded to bf16, unchanged by 4 steps
            assert v.dtype == torch.bfloat16, k
            assert torch.equal(v, init[k.replace(".base_layer.", ".")].bfloat16()), k
    w = "model.layers.0.self_attn.q_proj"
    assert not torch.equal(ck[f"{w}.lora_B.default.weight"],
                           torch.zeros_like(ck[f"{w}.lora_B.default.weight"]))
    opt = load_file(a / "optimizer.safetensors")
    assert opt and all(v.dtype == torch.float32 for k, v in opt.items() if v.dim() > 0)


def test_bf16_base_dtypes_merge_and_adapter_engine():
    from traingym.models.loader import load_policy
    from traingym.rollout.torch_engine import TorchEngine
    from traingym.trainer.lora import AdapterEngine, LoraTrainer, base_dtype

    tok = tiny_tokenizer()
    cfg = _bf16(1)
    trainer = LoraTrainer(tiny_model(tok, seed=1), cfg.trainer, 1.0, tok.pad_token_id,
                          lora=cfg.lora)
    for n, p in trainer.model.named_parameters():
        assert p.dtype == (torch.float32 if ".lora_" in n else torch.bfloat16), n
        assert p.requires_grad == (".lora_" in n), n
    group = trainer.optimizer.param_groups[0]["params"]
    assert len(group) == 2 * 4 * 2 and all(p.dtype == torch.float32 for p in group)
    layer = trainer.model.model.layers[0].self_attn.q_proj
    with torch.no_grad():
        layer.lora_B["default"].weight.normal_()
    merged = merged_state(trainer.model)
    q = "model.layers.0.self_attn.q_proj.weight"
    a, b = layer.lora_A["default"].weight, layer.lora_B["default"].weight
    assert merged[q].dtype == torch.float32  # computed in fp32 from the bf16 W
    assert torch.equal(merged[q], layer.base_layer.weight.float() + (b @ a) * 2.0)
    assert merged["model.layers.0.mlp.up_proj.weight"].dtype == torch.bfloat16
    # adapter sync onto a fp32 engine holding the same (bf16) base: the same bits as merged
    base, _ = load_policy("tiny", seed=1, dtype=torch.bfloat16)
    engine = AdapterEngine(TorchEngine(base, tok.pad_token_id, dtype=torch.float32), cfg.lora)
    assert all(t.dtype == torch.float32 for t in engine.base.values())
    engine.update_weights({k: v.clone() for k, v in adapter_state(trainer.model).items()}, 1)
    assert torch.equal(engine.model.state_dict()[q], merged[q])
    assert base_dtype(LoraConfig(rank=2, base_dtype="auto"), cfg.trainer.model_copy(
        update={"bf16_autocast": False})) == torch.float32


def test_adapter_sync_shares_the_frozen_base_with_the_engine(tmp_path):
    """lora.sync='adapter' with the engine in the base's dtype: the engine's tensors outside the
    adapted layers, and AdapterEngine's base of those layers, are the trainer's frozen tensors
    (one copy); the adapted layers are the engine's own and get base + (alpha / r) B A."""
    from traingym.loop.build import build_run
    from traingym.loop.sync import train_loop

    cfg = traingym.build_config("tiny", overrides={
        "steps": 2, "eval": {"before": False, "after": False},
        "model": {"engine_dtype": "bfloat16"}, "trainer": {"lr": 1e-2, "bf16_autocast": True},
        "lora": {"rank": 4, "alpha": 8.0, "sync": "adapter", "base_dtype": "bfloat16"}})
    run, start = build_run(cfg, tmp_path / "run", False, progress=False)
    try:
        train_loop(run, start)
        theirs = {k.replace(".base_layer.", "."): v for k, v in
                  run.trainer.model.state_dict().items() if ".lora_" not in k}
        engine = run.engine.inner.model.state_dict()
        assert engine.keys() == theirs.keys()
        q = "model.layers.0.self_attn.q_proj"
        for k, v in engine.items():
            if "rotary" in k:
                continue
            shared = v.data_ptr() == theirs[k].data_ptr()
            assert shared == (k.split(".")[-2] not in cfg.lora.target_modules), k
        assert run.engine.base[q].data_ptr() == theirs[f"{q}.weight"].data_ptr()
        ab = {k: v.bfloat16().float() for k, v in adapter_state(run.trainer.model).items()}
        expect = (theirs[f"{q}.weight"].float() + 2.0 * (ab[f"{q}.lora_B.weight"]
                                                         @ ab[f"{q}.lora_A.weight"]))
        assert torch.equal(engine[f"{q}.weight"], expect.bfloat16())
        assert not torch.equal(engine[f"{q}.weight"], theirs[f"{q}.weight"])  # it trained
    finally:
        run.close()
