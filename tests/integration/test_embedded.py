"""The embedded model end to end: conversion, chat template, fused engine, a few RL steps."""

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import traingym
from traingym.models.embedded import embedded_model_dir
from traingym.rollout.torch_engine import TorchEngine
from traingym.core.types import GenerationRequest, SamplingParams

pytestmark = pytest.mark.slow


def test_fused_engine_matches_hf_greedy_on_embedded_model():
    folder = embedded_model_dir()
    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    ids = tok.apply_chat_template([{"role": "user", "content": "What is 3 + 4?"}],
                                  add_generation_prompt=True, tokenize=False) + "The answer is"
    prompt = tuple(tok(ids, add_special_tokens=False)["input_ids"])
    eos = tok.eos_token_id
    out = TorchEngine(model, tok.pad_token_id).generate_sync(
        [GenerationRequest(prompt, 1, SamplingParams(0, max_new_tokens=12, stop_token_ids=(eos,)))])[0][0]
    ref = model.generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False,
                         eos_token_id=eos, pad_token_id=tok.pad_token_id)[0, len(prompt):].tolist()
    ref = ref[: ref.index(eos) + 1] if eos in ref else ref
    assert out.token_ids == ref


def test_embedded_default_runs_three_steps(tmp_path):
    cfg = traingym.build_config(overrides={"steps": 3, "eval": {"num_prompts": 16, "samples_per_prompt": 2}})
    result = traingym.train(cfg, run_dir=tmp_path / "r", progress=False)
    assert result.final_metrics["step"] == 3
    assert 0.0 < result.eval["before"]["greedy"]["mean"] < 1.0
