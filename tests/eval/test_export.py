"""`traingym export`: a tiny run's checkpoint as a plain Hugging Face folder. transformers loads
it unchanged (AutoModelForCausalLM / AutoTokenizer / GenerationConfig) and its logits equal
traingym's: bitwise against the checkpoint loaded into the run's own model, and within fp32
rounding (atol 1e-5) against the built-in engine (TorchEngine, its fused decode path) on the same
tokens. With `.venv-vllm` present, vLLM loads an exported folder and decodes the same greedy
tokens and log-probs (atol 1e-4) as the engine; without it the test skips locally and fails
under CI (tests/prereq.py). vLLM's CPU attention takes head sizes 32, 64, ... only, so that
test exports a 1-step run on a small Llama folder with head_dim 32, not the tiny preset's
(head_dim 16) model."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch
from prereq import missing

from traingym.cli import main

REPO = Path(__file__).resolve().parents[2]
VLLM_PY = REPO / ".venv-vllm" / "bin" / "python"


@pytest.fixture(scope="module")
def exported(tiny_run, tmp_path_factory):
    out = tmp_path_factory.mktemp("export") / "hf"
    assert main(["export", str(tiny_run / "checkpoints" / "step_000004"), str(out)]) == 0
    return out


def _run_model(tiny_run):
    from safetensors.torch import load_model

    from traingym.models.loader import load_policy

    model, tok = load_policy("tiny", seed=0)
    load_model(model, str(tiny_run / "checkpoints" / "step_000004" / "model.safetensors"))
    return model.eval(), tok


def _prompt_ids(tok) -> list[int]:
    msgs = [{"role": "user", "content": "What is 3 + 4?"}]
    return tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True,
                                   return_dict=False)


def test_transformers_loads_it_and_logits_match(tiny_run, exported):
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    from traingym.config.engines import engine_context
    from traingym.config.load import build_config
    from traingym.core.types import GenerationRequest, SamplingParams
    from traingym.rollout.registry import build

    names = {p.name for p in exported.iterdir()}
    assert {"config.json", "model.safetensors", "generation_config.json",
            "tokenizer.json", "tokenizer_config.json"} <= names
    hf = AutoModelForCausalLM.from_pretrained(exported).eval()
    hf_tok = AutoTokenizer.from_pretrained(exported)
    model, tok = _run_model(tiny_run)
    ids = _prompt_ids(tok)
    assert _prompt_ids(hf_tok) == ids  # the chat template and tokenizer came along
    gen = GenerationConfig.from_pretrained(exported)
    assert gen.eos_token_id == tok.eos_token_id and gen.pad_token_id == tok.pad_token_id

    x = torch.tensor([ids])
    with torch.no_grad():
        hf_logits = hf(x).logits[0]  # (T, V)
        assert torch.equal(hf_logits, model(x).logits[0])  # the same weights, bitwise
    engine, _ = build(engine_context(build_config("tiny")), model, tok)
    assert engine.fused is not None  # the engine's own decode path, not HF's forward
    # prefill logits of the engine at the last prompt position
    from traingym.core.padding import left_pad

    ids_P_T, mask_P_T = left_pad([ids], tok.pad_token_id, torch.device("cpu"))
    pos = (mask_P_T.cumsum(-1) - 1).clamp(min=0)
    eng_logits, _ = engine._prefill(ids_P_T, mask_P_T, pos, torch.tensor([1]), 8)
    torch.testing.assert_close(eng_logits[0], hf_logits[-1], atol=1e-5, rtol=1e-5)
    # every decoded token's log-prob (greedy: log softmax(logits)) against the exported model's
    comp = engine.generate_sync([GenerationRequest(tuple(ids), 1, SamplingParams(
        temperature=0.0, max_new_tokens=8, stop_token_ids=()), seed=0)])[0][0]
    full = torch.tensor([ids + list(comp.token_ids)])
    with torch.no_grad():
        logp = hf(full).logits[0].log_softmax(-1)
    T = len(ids)
    want = [logp[T - 1 + i, t].item() for i, t in enumerate(comp.token_ids)]
    assert comp.token_ids == [int(logp[T - 1 + i].argmax()) for i in range(len(want))]
    assert comp.logprobs == pytest.approx(want, abs=1e-5)


def test_refuses_a_non_empty_folder_and_bad_sources(tiny_run, tmp_path, capsys):
    out = tmp_path / "taken"
    out.mkdir()
    (out / "x").write_text("keep me")
    assert main(["export", str(tiny_run), str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("traingym: export:") and "not empty" in err
    assert (out / "x").read_text() == "keep me"
    assert main(["export", "tiny", str(tmp_path / "o")]) == 2
    assert "not a checkpoint folder or run directory" in capsys.readouterr().err
    # a run directory means its latest checkpoint; an empty folder is fine
    (tmp_path / "empty").mkdir()
    assert main(["export", str(tiny_run), str(tmp_path / "empty")]) == 0
    assert (tmp_path / "empty" / "model.safetensors").is_file()


VLLM_SCRIPT = """
import json, sys, os
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
import vllm
llm = vllm.LLM(model=sys.argv[1], dtype="float32", max_model_len=128, enforce_eager=True,
               gpu_memory_utilization=0.3)
ids = json.loads(sys.argv[2])
params = vllm.SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True, logprobs=1)
out = llm.generate([vllm.TokensPrompt(prompt_token_ids=ids)], params)[0].outputs[0]
lps = [d[t].logprob for t, d in zip(out.token_ids, out.logprobs)]
print("RESULT " + json.dumps({"tokens": list(out.token_ids), "logprobs": lps}))
"""


def _head_dim_32_run(tmp: Path) -> Path:
    """A 1-step run on a small Llama folder with head_dim 32 (vLLM's CPU attention takes head
    sizes 32, 64, ...; the tiny preset's model has 16)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    import traingym
    from traingym.models.loader import tiny_tokenizer

    tok = tiny_tokenizer()
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(
        vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=256,
        tie_word_embeddings=True, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
        bos_token_id=tok.bos_token_id))
    model.save_pretrained(tmp / "base")
    tok.save_pretrained(tmp / "base")
    cfg = traingym.build_config("tiny", overrides={
        "steps": 1, "model": {"path": str(tmp / "base")},
        "eval": {"before": False, "after": False}})
    traingym.train(cfg, run_dir=tmp / "run", progress=False)
    return tmp / "run"


def test_vllm_loads_the_export(tmp_path):
    if not VLLM_PY.exists():
        missing(f"{VLLM_PY} is absent (bash scripts/setup_vllm.sh builds it)")
    from traingym.config.load import run_config
    from traingym.core.types import GenerationRequest, SamplingParams
    from traingym.eval.specs import build_engine_for
    from traingym.models.spec import ModelSpec

    run = _head_dim_32_run(tmp_path)
    assert main(["export", str(run), str(tmp_path / "hf")]) == 0
    spec = ModelSpec("run", str(tmp_path / "base"), run / "checkpoints" / "step_000001", run)
    engine, tok = build_engine_for(run_config(run), spec)
    ids = _prompt_ids(tok)
    proc = subprocess.run([str(VLLM_PY), "-c", VLLM_SCRIPT, str(tmp_path / "hf"),
                           json.dumps(ids)], capture_output=True, text=True, timeout=600)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    got = json.loads(lines[-1].removeprefix("RESULT "))
    comp = engine.generate_sync([GenerationRequest(tuple(ids), 1, SamplingParams(
        temperature=0.0, max_new_tokens=8, stop_token_ids=()), seed=0)])[0][0]
    assert got["tokens"] == comp.token_ids
    assert got["logprobs"] == pytest.approx(comp.logprobs, abs=1e-4)
