"""Pieces of the server that need no server: stop strings and streaming pieces (text.finish),
tool-call parsing into the OpenAI format, and the built-in engine's top_logprobs (off: the
same tokens and log-probs as before; on: the k best of the same distribution)."""

import json

import pytest
import torch

from traingym.models.loader import tiny_model, tiny_tokenizer
from traingym.rollout.torch_engine import TorchEngine
from traingym.serve.text import finish, tool_calls
from traingym.core.types import GenerationRequest, SamplingParams


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()


def test_finish_stop_string_cuts_text_tokens_and_pieces(tok):
    ids = tok("What is 2 + 3? The answer is 5.", add_special_tokens=False)["input_ids"]
    text, kept, reason, pieces = finish(tok, ids, "length", ["answer"], (tok.eos_token_id,))
    assert text == "What is 2 + 3? The " and reason == "stop"
    assert "".join(pieces) == text and len(pieces) == kept
    assert tok.decode(ids[:kept]).startswith(text)  # the kept tokens cover the text
    assert not tok.decode(ids[:kept - 1]).startswith(text)  # and no more than needed


def test_finish_drops_end_of_turn_and_keeps_all_without_stops(tok):
    ids = tok("The answer is 5.", add_special_tokens=False)["input_ids"]
    text, kept, reason, pieces = finish(tok, ids + [tok.eos_token_id], "stop", [],
                                        (tok.eos_token_id,))
    assert (text, kept, reason) == ("The answer is 5.", len(ids), "stop")
    assert "".join(pieces) == text
    text, kept, reason, _ = finish(tok, ids, "length", ["zzz"], (tok.eos_token_id,))
    assert (text, kept, reason) == ("The answer is 5.", len(ids), "length")


def test_finish_stop_at_start_keeps_nothing(tok):
    ids = tok("5 and more", add_special_tokens=False)["input_ids"]
    assert finish(tok, ids, "length", ["5"], ())[:3] == ("", 0, "stop")


def test_tool_calls_openai_format_and_malformed_stay_content():
    text = 'ok <tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>'
    content, calls = tool_calls(text)
    assert content == "ok"
    assert calls == [{"name": "add", "arguments": json.dumps({"a": 1})}]
    for bad in ['<tool_call>{"name": "add"', "<tool_call>not json</tool_call>", "plain"]:
        assert tool_calls(bad) == (bad, [])


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_engine_top_logprobs(tok, temperature):
    engine = TorchEngine(tiny_model(tok), tok.pad_token_id)
    prompts = [tuple(tok(p)["input_ids"]) for p in ("What is 2 + 3?", "What is 7 * 8? The")]
    plain = [GenerationRequest(p, 2, SamplingParams(temperature, max_new_tokens=6), seed=3)
             for p in prompts]
    topk = [GenerationRequest(p, 2, SamplingParams(temperature, max_new_tokens=6,
                                                   top_logprobs=4), seed=3) for p in prompts]
    a, b = engine.generate_sync(plain), engine.generate_sync(topk)
    for ca, cb in zip(sum(a, []), sum(b, [])):
        assert ca.token_ids == cb.token_ids and ca.logprobs == cb.logprobs
        assert ca.top_logprobs is None and len(cb.top_logprobs) == len(cb.token_ids)
        for t, lp, top in zip(cb.token_ids, cb.logprobs, cb.top_logprobs):
            assert len(top) == 4 and [x[1] for x in top] == sorted((x[1] for x in top),
                                                                   reverse=True)
            assert lp <= top[0][1] + 1e-6
            if temperature == 0:
                assert top[0] == (t, pytest.approx(lp))
    # the k best are those of the full distribution: check the first step against a forward
    with torch.no_grad():
        logits = engine.model(torch.tensor([prompts[0]])).logits[0, -1].float()
    lp = (logits / temperature if temperature else logits).log_softmax(-1)
    best = torch.topk(lp, 4)
    assert [i for i, _ in b[0][0].top_logprobs[0]] == best.indices.tolist()
    assert [x for _, x in b[0][0].top_logprobs[0]] == pytest.approx(best.values.tolist(), abs=1e-5)


def test_merged_lengths_cut_back_equal_own_length(tok):
    """Requests differing only in max_tokens decode as one batch (batching.merge_lengths) and
    are cut back (batching.cut) to exactly what each gets alone, greedy and sampled."""
    from traingym.serve.batching import cut, merge_lengths

    engine = TorchEngine(tiny_model(tok), tok.pad_token_id)
    p = tuple(tok("What is 2 + 3?")["input_ids"])
    reqs = [GenerationRequest(p, 2, SamplingParams(t, max_new_tokens=m, top_logprobs=2), seed=s)
            for t in (0.0, 1.0) for m, s in ((3, 1), (9, 2))]
    merged = merge_lengths(reqs)
    assert {r.params.max_new_tokens for r in merged} == {9}
    together = engine.generate_sync(merged)
    for r, comps in zip(reqs, together):
        alone = engine.generate_sync([r])[0]
        got = [cut(c, r.params.max_new_tokens) for c in comps]
        for g, a in zip(got, alone):  # log-probs: equal up to the batch shape's rounding
            assert (g.token_ids, g.finish_reason) == (a.token_ids, a.finish_reason)
            assert g.logprobs == pytest.approx(a.logprobs, abs=1e-5)
            assert [[i for i, _ in t] for t in g.top_logprobs] == \
                [[i for i, _ in t] for t in a.top_logprobs]
