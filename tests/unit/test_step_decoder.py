"""rollout/continuous.py StepDecoder: rows admitted and retired between decode steps give the
completions `TorchEngine.generate` gives each request alone (tiny model)."""

import pytest
import torch

from traingym.models.loader import tiny_model, tiny_tokenizer
from traingym.rollout.torch_engine import TorchEngine
from traingym.core.types import GenerationRequest, SamplingParams


@pytest.fixture(scope="module")
def engine():
    tok = tiny_tokenizer()
    return TorchEngine(tiny_model(tok, seed=1).eval(), tok.pad_token_id), tok


def drain(dec, handles: dict, until_empty=True, steps=None):
    """Step until no rows are live (or `steps` steps); {row id: [RowToken]}."""
    out = {r: [] for ids in handles.values() for r in ids}
    n = 0
    while dec.live and (steps is None or n < steps):
        for t in dec.step():
            out.setdefault(t.row, []).append(t)
        n += 1
    return out


def test_staggered_rows_equal_generate_alone(engine):
    eng, tok = engine
    prompts = [tuple(tok(f"What is {a} + {b}?")["input_ids"]) for a, b in
               [(1, 2), (13, 4), (7, 19), (250, 3)]]
    reqs = [GenerationRequest(prompts[0], 1, SamplingParams(0, max_new_tokens=12, top_logprobs=3)),
            GenerationRequest(prompts[1], 2, SamplingParams(0.9, top_p=0.8, max_new_tokens=7),
                              seed=4),
            GenerationRequest(prompts[2], 1, SamplingParams(1.0, top_k=20, max_new_tokens=3),
                              seed=9),
            GenerationRequest(prompts[3], 1, SamplingParams(0, max_new_tokens=9))]
    dec = eng.step_decoder()
    got: dict[int, list] = {}
    handles = {}
    handles[0] = dec.admit([reqs[0]])[0]
    for t in dec.step() + dec.step():  # request 0 decodes alone for two steps
        got.setdefault(t.row, []).append(t)
    handles[1], handles[2] = dec.admit(reqs[1:3])  # two join at once (left-padded prefill)
    for t in dec.step():
        got.setdefault(t.row, []).append(t)
    handles[3] = dec.admit([reqs[3]])[0]
    for row, toks in drain(dec, handles).items():
        got.setdefault(row, []).extend(toks)
    assert dec.live == 0
    for i, r in enumerate(reqs):
        alone = eng.generate_sync([r])[0]
        for row, comp in zip(handles[i], alone):
            toks = got[row]
            assert [t.token for t in toks] == comp.token_ids, f"request {i}"
            assert [t.logprob for t in toks] == pytest.approx(comp.logprobs, abs=1e-4)
            assert toks[-1].finish_reason == comp.finish_reason
            assert all(t.finish_reason is None for t in toks[:-1])
            if comp.top_logprobs is not None:
                for t, top in zip(toks, comp.top_logprobs):
                    assert [i for i, _ in t.top] == [i for i, _ in top]
                    assert [lp for _, lp in t.top] == pytest.approx([lp for _, lp in top],
                                                                    abs=1e-4)


def test_stop_tokens_end_rows_and_retired_rows_free_their_place(engine):
    eng, tok = engine
    prompt = tuple(tok("What is 3 + 4?")["input_ids"])
    free = GenerationRequest(prompt, 1, SamplingParams(0, max_new_tokens=8))
    first = eng.generate_sync([free])[0][0].token_ids
    k = next(i for i, t in enumerate(first) if t != first[0])  # the first new token id
    stop = GenerationRequest(prompt, 1, SamplingParams(0, max_new_tokens=8,
                                                       stop_token_ids=(first[k],)))
    dec = eng.step_decoder(max_rows=4)
    (a,), (b,), (c,) = dec.admit([free, stop, free])
    toks = drain(dec, {0: [a, b, c]}, steps=k + 1)
    assert [t.token for t in toks[b]] == first[:k + 1] and toks[b][-1].finish_reason == "stop"
    assert dec.live == 2
    dec.retire([a])
    assert dec.live == 1 and dec.free() == 3
    rest = drain(dec, {0: [c]})
    assert [t.token for t in toks[c] + rest[c]] == first  # moved into a's place, unchanged
    with pytest.raises(ValueError, match="non-empty prompt"):
        dec.admit([GenerationRequest((), 1, SamplingParams())])


def test_engine_declares_step_decoding_only_with_the_fused_path(engine):
    eng, tok = engine
    assert eng.abilities.step_decoding
    plain = TorchEngine(eng.model, tok.pad_token_id, fused=False)
    assert not plain.abilities.step_decoding
    with pytest.raises(ValueError, match="fused decode path"):
        plain.step_decoder()
    assert torch.is_tensor(eng.step_decoder().first_B)


@pytest.mark.parametrize("model_type,extra", [
    ("mistral", {"sliding_window": 5}),
    ("gemma2", {"head_dim": 16, "sliding_window": 4, "query_pre_attn_scalar": 20,
                "attn_logit_softcapping": 5.0, "final_logit_softcapping": 3.0}),
])
def test_sliding_window_families_equal_generate(model_type, extra):
    """Per-row slots with windows shorter than the prompts and completions."""
    from transformers import AutoConfig, AutoModelForCausalLM

    tok = tiny_tokenizer()
    config = AutoConfig.for_model(
        model_type, vocab_size=len(tok), hidden_size=64, intermediate_size=128,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=256, pad_token_id=tok.pad_token_id, **extra)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    eng = TorchEngine(model, tok.pad_token_id)
    params = SamplingParams(0, max_new_tokens=10)
    reqs = [GenerationRequest(tuple(tok(t)["input_ids"]), 1, params)
            for t in ("What is 1 + 2?", "Hi", "What is 130 + 4 and 7 * 19?")]
    dec = eng.step_decoder()
    rows = [dec.admit([reqs[0]])[0][0]]
    got = {}
    for r in reqs[1:]:
        for t in dec.step() + dec.step():
            got.setdefault(t.row, []).append(t)
        rows.append(dec.admit([r])[0][0])
    for row, toks in drain(dec, {}).items():
        got.setdefault(row, []).extend(toks)
    for r, row in zip(reqs, rows):
        comp = eng.generate_sync([r])[0][0]
        assert [t.token for t in got[row]] == comp.token_ids
        assert [t.logprob for t in got[row]] == pytest.approx(comp.logprobs, abs=1e-4)


def test_cache_slots_grow_with_the_rows_without_changing_them(engine):
    eng, tok = engine
    r = GenerationRequest(tuple(tok("What is 3 + 4?")["input_ids"]), 3,
                          SamplingParams(0.8, max_new_tokens=200), seed=3)
    dec = eng.step_decoder(max_rows=8)
    rows = dec.admit([r])[0]
    first_slots = dec.cache[0][0].shape[2]
    got = drain(dec, {0: rows})
    assert dec.cache[0][0].shape[2] > first_slots  # grew (several times) while decoding
    assert dec.cache[0][0].shape[0] == 3  # rows only as many as needed
    for row, comp in zip(rows, eng.generate_sync([r])[0]):
        assert [t.token for t in got[row]] == comp.token_ids
