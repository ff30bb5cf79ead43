"""The decoder families (models/families.py) through the built-in engine, its fused decode
(rollout/fused_decoder.py) and the trainer, on tiny random models built offline.

Each case is a 2-layer, hidden-64 model of the family with the tiny tokenizer's vocabulary,
its parameters (norm weights and biases included) moved off their init so that Gemma's
(1 + w) norms, Qwen's biases and Qwen3's q/k norms are not identities. Windowed cases use a
window shorter than the test sequences, and the tests check that the window binds.

Tolerances: fp32 logits of the fused path equal HF's forward to 1e-4 (measured ~1e-6);
bf16 (emulated on this CPU, no bf16 kernels) to 0.05 absolute on logits of magnitude ~1.5-3
(measured up to ~0.02: HF's kernels and these matmuls round differently). Token-level
equality of generations is checked in fp32 only.
"""

import copy
import json

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

import traingym
from traingym.envs.render import PromptRenderer
from traingym.models.families import END_OF_TURN, FAMILIES, chat_template, stop_token_ids
from traingym.models.loader import tiny_tokenizer
from traingym.observability.events import read_events
from traingym.core.padding import left_pad
from traingym.rollout import fused_decoder
from traingym.rollout.fused_decoder import FusedDecoder, unsupported
from traingym.rollout.torch_engine import TorchEngine
from traingym.trainer.logprobs import completion_logprobs
from traingym.core.types import GenerationRequest, SamplingParams

LLAMA3_ROPE = {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0,
               "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 16}
GEMMA_SOFT = {"head_dim": 16, "sliding_window": 4, "query_pre_attn_scalar": 20}
MOE = {"num_experts_per_tok": 2}

# name: (model_type, tied embeddings, extra config)
CASES = {
    "llama": ("llama", True, {}),
    "llama-untied-llama3-rope": ("llama", False, {"rope_parameters": LLAMA3_ROPE}),
    "llama-linear-rope": ("llama", True, {"rope_parameters": {
        "rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0}}),
    "llama-biases": ("llama", False, {"attention_bias": True, "mlp_bias": True}),
    "mistral-window": ("mistral", False, {"sliding_window": 5}),
    "qwen2": ("qwen2", True, {}),
    "qwen2-untied-window": ("qwen2", False, {"use_sliding_window": True, "sliding_window": 4,
                                             "max_window_layers": 1}),
    "qwen3": ("qwen3", True, {"head_dim": 24}),
    "qwen3-untied": ("qwen3", False, {"head_dim": 24}),
    "gemma": ("gemma", True, {"head_dim": 16}),
    "gemma2": ("gemma2", True, {**GEMMA_SOFT, "attn_logit_softcapping": 5.0,
                                "final_logit_softcapping": 3.0}),
    # Gemma 3: transformers ignores attn_logit_softcapping (set here to check that the fused
    # path ignores it too) and applies final_logit_softcapping
    "gemma3": ("gemma3_text", True, {**GEMMA_SOFT, "attn_logit_softcapping": 5.0,
                                     "final_logit_softcapping": 3.0, "layer_types": [
        "sliding_attention", "full_attention"], "rope_parameters": {
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        "full_attention": {"rope_type": "linear", "rope_theta": 1000000.0, "factor": 8.0}}}),
    # sparse MoE blocks (rollout/fused_moe.py); Qwen3-MoE's second layer a dense MLP
    "qwen3_moe-dense-layer": ("qwen3_moe", False, {**MOE, "head_dim": 16, "num_experts": 8,
                                                   "moe_intermediate_size": 32,
                                                   "norm_topk_prob": True,
                                                   "mlp_only_layers": [1]}),
    "mixtral-window": ("mixtral", False, {**MOE, "num_local_experts": 8, "sliding_window": 5}),
    # Qwen2-MoE: a sigmoid-gated shared expert beside the routed ones, q/k/v biases
    "qwen2_moe-shared": ("qwen2_moe", False, {**MOE, "num_experts": 8,
                                              "moe_intermediate_size": 32,
                                              "shared_expert_intermediate_size": 48}),
}
# Near-uniform routers (HF's init) can near-tie in bf16: the two paths' attention rounds
# differently and a token goes to another expert. qwen2_moe-shared at seed 0 does so at one
# decode step (max |logit diff| 0.086 there, 0.008-0.012 at the others; with its routers
# scaled 20x every step is < 0.02), so its bf16 case builds seed 1.
BF16_SEED = {"qwen2_moe-shared": 1}
WINDOWED = {"mistral-window", "qwen2-untied-window", "gemma2", "gemma3", "mixtral-window"}
TRAINED = ["llama", "mistral-window", "qwen2-untied-window", "qwen3", "gemma", "gemma2",
           "gemma3", "qwen3_moe-dense-layer", "mixtral-window",
           "qwen2_moe-shared"]  # one training run per family


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()


def build(tok, name: str, seed: int = 0, **override):
    model_type, tied, extra = CASES[name]
    config = AutoConfig.for_model(
        model_type, vocab_size=len(tok), hidden_size=64, intermediate_size=128,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=256, tie_word_embeddings=tied, pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id, bos_token_id=tok.bos_token_id, **{**extra, **override})
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config).eval()
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p) * 0.05)
    assert (model.lm_head.weight is model.model.embed_tokens.weight) == tied
    return model


def prompts(tok):
    return [tuple(tok(f"What is {a} + {b}?")["input_ids"]) for a, b in [(1, 2), (13, 4), (7, 19)]]


def fused_and_hf_logits(model, tok, steps: int = 6):
    """Last-position logits of the fused path (prefill, then greedy decode steps) and of HF's
    full forward over the same left-padded sequences, step by step."""
    fused = FusedDecoder(model)
    ids, mask = left_pad(prompts(tok), tok.pad_token_id)
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    got, cache = fused.prefill(ids, mask, pos, ids.shape[1] + steps)
    pairs = []
    for _ in range(steps + 1):
        with torch.no_grad():
            want = model(input_ids=ids, attention_mask=mask, position_ids=pos).logits[:, -1].float()
        pairs.append((got, want))
        nxt = want.argmax(-1)
        ids = torch.cat([ids, nxt[:, None]], 1)
        mask = torch.cat([mask, torch.ones_like(nxt)[:, None]], 1)
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        got = fused.decode(nxt, pos[:, -1], cache, ids.shape[1] - 1, mask)
    return pairs, ids.shape[1]


@pytest.mark.parametrize("dtype,atol", [(torch.float32, 1e-4), (torch.bfloat16, 0.05)],
                         ids=["fp32", "bf16"])
@pytest.mark.parametrize("name", list(CASES))
def test_fused_logits_match_hf_forward(tok, name, dtype, atol):
    model = build(tok, name, seed=BF16_SEED.get(name, 0) if dtype == torch.bfloat16 else 0)
    model = model.to(dtype)
    assert unsupported(model) is None
    pairs, length = fused_and_hf_logits(model, tok)
    for step, (got, want) in enumerate(pairs):
        err = (got - want).abs().max().item()
        assert err <= atol, f"{name} {dtype} step {step}: max |logit diff| {err:.2e} > {atol}"
    if name in WINDOWED:  # the test sequences pass the window, so it must change the logits
        window = model.config.sliding_window
        assert length > window
        wide = build(tok, name, sliding_window=length + 1).to(dtype)
        wide_pairs, _ = fused_and_hf_logits(wide, tok)
        assert (wide_pairs[-1][1] - pairs[-1][1]).abs().max() > 10 * atol


@pytest.mark.parametrize("name", list(CASES))
def test_engine_fused_generation_equals_plain_hf_engine(tok, name):
    model = build(tok, name)
    fused = TorchEngine(model, tok.pad_token_id, fused=True)
    plain = TorchEngine(model, tok.pad_token_id, fused=False)
    assert fused.fused is not None and plain.fused is None
    for params in (SamplingParams(temperature=0, max_new_tokens=8),
                   SamplingParams(temperature=1.0, top_p=0.9, top_k=50, max_new_tokens=8)):
        reqs = [GenerationRequest(p, 3, params, seed=i) for i, p in enumerate(prompts(tok))]
        for ga, gb in zip(fused.generate_sync(reqs), plain.generate_sync(reqs)):
            for ca, cb in zip(ga, gb):
                assert ca.token_ids == cb.token_ids
                assert torch.allclose(torch.tensor(ca.logprobs), torch.tensor(cb.logprobs),
                                      atol=1e-4)


@pytest.mark.parametrize("name", list(CASES))
def test_trainer_logprobs_match_the_engines(tok, name):
    """The trainer's shared-prefix forward (HF model, repeated KV cache) gives the log-probs
    the fused engine sampled with."""
    model = build(tok, name)
    engine = TorchEngine(copy.deepcopy(model), tok.pad_token_id)
    params = SamplingParams(temperature=0.8, max_new_tokens=6)
    groups = engine.generate_sync([GenerationRequest(p, 3, params, seed=i)
                                   for i, p in enumerate(prompts(tok))])
    out = completion_logprobs(model, [g[0].prompt_ids for g in groups],
                              [[c.token_ids for c in g] for g in groups], 0.8, tok.pad_token_id)
    rows = [c for g in groups for c in g]
    for i, c in enumerate(rows):
        want = torch.tensor(c.logprobs)
        assert torch.allclose(out.logp_B_T[i, : len(c.logprobs)].detach(), want, atol=1e-4)


def test_an_uncovered_model_decodes_with_the_hf_forward(tok):
    model = build(tok, "llama", rope_parameters={"rope_type": "dynamic", "rope_theta": 10000.0,
                                                 "factor": 2.0})
    assert "dynamic" in unsupported(model)
    engine = TorchEngine(model, tok.pad_token_id, fused=True)
    assert engine.fused is None
    out = engine.generate_sync([GenerationRequest(p, 1, SamplingParams(0, max_new_tokens=5))
                                for p in prompts(tok)])
    for p, comps in zip(prompts(tok), out):
        ref = model.generate(torch.tensor([p]), max_new_tokens=5, min_new_tokens=5,
                             do_sample=False, pad_token_id=tok.pad_token_id)
        assert comps[0].token_ids == ref[0, len(p):].tolist()
    phi = AutoModelForCausalLM.from_config(AutoConfig.for_model(
        "phi3", vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=1,
        num_attention_heads=4, num_key_value_heads=2, pad_token_id=tok.pad_token_id))
    assert "'phi3' is not a covered family" in unsupported(phi)
    with pytest.raises(ValueError, match="does not cover"):
        FusedDecoder(phi)


@pytest.mark.parametrize("name", TRAINED)
def test_a_short_training_run_of_each_family_trains(tok, name, tmp_path, monkeypatch):
    folder = tmp_path / "model"
    build(tok, name).save_pretrained(folder)
    tok.save_pretrained(folder)
    prefills = []
    real_prefill = fused_decoder.FusedDecoder.prefill
    monkeypatch.setattr(fused_decoder.FusedDecoder, "prefill",
                        lambda self, *a, **k: prefills.append(1) or real_prefill(self, *a, **k))
    cfg = traingym.build_config("tiny", overrides={
        "steps": 3, "model": {"path": str(folder)}, "eval": {"before": False, "after": False}})
    result = traingym.train(cfg, run_dir=tmp_path / "run", progress=False)
    events = read_events(result.run_dir)
    assert [e["step"] for e in events] == [1, 2, 3]
    assert prefills, "the engine never used the fused path"
    trained = [e for e in events if e["groups_kept"] > 0]
    assert trained and all(e["grad_norm"] > 0 for e in trained)
    assert all(e["mismatch_abs_logp"] < 1e-4 for e in trained)  # engine vs trainer, fp32
    from safetensors.torch import load_file

    before = load_file(folder / "model.safetensors")
    after = load_file(tmp_path / "run/checkpoints/step_000003/model.safetensors")
    assert any(not torch.equal(before[k], after[k]) for k in before if k in after)
    config = json.loads((folder / "config.json").read_text())
    assert config["model_type"] == CASES[name][0]


# (d) chat templates: each family's format on the tiny tokenizer, through traingym's renderer
Q = "What is 2 + 3?"
SYS = "Be brief."
CHATML_Q = f"<|im_start|>user\n{Q}<|im_end|>\n<|im_start|>assistant\nThe answer is"
LLAMA3_Q = (f"<|start_header_id|>user<|end_header_id|>\n\n{Q}<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\nThe answer is")
GEMMA_TURN = "<start_of_turn>user\n{}<end_of_turn>\n<start_of_turn>model\nThe answer is"
RENDERED = {  # template: (no system prompt, with task.system_prompt = SYS); {bos} = bos_token
    "chatml-qwen2.5": (
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
        "assistant.<|im_end|>\n" + CHATML_Q,
        f"<|im_start|>system\n{SYS}<|im_end|>\n" + CHATML_Q),
    "qwen3": (CHATML_Q, f"<|im_start|>system\n{SYS}<|im_end|>\n" + CHATML_Q),
    "llama3": ("{bos}" + LLAMA3_Q,
               "{bos}<|start_header_id|>system<|end_header_id|>\n\n" + SYS + "<|eot_id|>"
               + LLAMA3_Q),
    "mistral": (f"{{bos}}[INST] {Q} [/INST]The answer is",
                f"{{bos}}[INST] {SYS}\n\n{Q} [/INST]The answer is"),
    "gemma": ("{bos}" + GEMMA_TURN.format(Q), None),  # no system role: refused
    "gemma3": ("{bos}" + GEMMA_TURN.format(Q), "{bos}" + GEMMA_TURN.format(f"{SYS}\n\n{Q}")),
}
NEXT_TURN = {  # what follows a policy turn that ended with the end-of-turn text
    "chatml-qwen2.5": "\n<|im_start|>user\nAnd 4 + 4?<|im_end|>\n<|im_start|>assistant\n",
    "qwen3": "\n<|im_start|>user\nAnd 4 + 4?<|im_end|>\n<|im_start|>assistant\n",
    "llama3": "<|start_header_id|>user<|end_header_id|>\n\nAnd 4 + 4?<|eot_id|>"
              "<|start_header_id|>assistant<|end_header_id|>\n\n",
    "mistral": "[INST] And 4 + 4? [/INST]",
    "gemma": "\n<start_of_turn>user\nAnd 4 + 4?<end_of_turn>\n<start_of_turn>model\n",
    "gemma3": "\n<start_of_turn>user\nAnd 4 + 4?<end_of_turn>\n<start_of_turn>model\n",
}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_each_familys_chat_template_through_the_renderer(family):
    import jinja2

    name = FAMILIES[family].chat_template
    tok = tiny_tokenizer()
    tok.chat_template = chat_template(name)
    plain, with_system = RENDERED[name]
    renderer = PromptRenderer(tok, prefill="The answer is")
    text = renderer.text({"prompt": Q})
    assert text == plain.format(bos=tok.bos_token)
    assert tok.decode(renderer.ids({"prompt": Q})) == text  # ids are the text, nothing lost
    if with_system is None:  # this template refuses a system message: refused when built,
        with pytest.raises(ValueError, match="refuses task.system_prompt.*System role not "
                           "supported.*unset task.system_prompt") as caught:  # with the fix
            PromptRenderer(tok, prefill="The answer is", system_prompt=SYS)
        assert isinstance(caught.value.__cause__, jinja2.TemplateError)
    else:
        system = PromptRenderer(tok, prefill="The answer is", system_prompt=SYS)
        assert system.text({"prompt": Q}) == with_system.format(bos=tok.bos_token)
    end = END_OF_TURN[name] or tok.eos_token
    follow = renderer.continuation([{"role": "user", "content": "And 4 + 4?"}], stop_text=end)
    assert follow == NEXT_TURN[name]


@pytest.mark.parametrize("name", sorted(RENDERED))
def test_sampling_stops_at_the_templates_end_of_turn_as_well_as_eos(name):
    """Gemma's eos is <eos> but its turns end with <end_of_turn>; Llama 3's turns end with
    <|eot_id|>: stop_token_ids holds the marker the template writes (when it is one token)."""
    tok = tiny_tokenizer()
    tok.add_special_tokens({"additional_special_tokens": ["<end_of_turn>", "<|eot_id|>"]})
    tok.chat_template = chat_template(name)
    marker = END_OF_TURN[name]
    expected = [tok.eos_token_id]
    if marker is not None and tok.convert_tokens_to_ids(marker) != tok.eos_token_id:
        expected.append(tok.convert_tokens_to_ids(marker))
    assert stop_token_ids(tok) == tuple(expected)
    tok.chat_template = chat_template("chatml-qwen2.5")  # a marker the template never writes
    assert stop_token_ids(tok) == (tok.eos_token_id,)  # is not a stop token
