"""Tokens that are part of a character (byte-level BPE pieces) as strings: `traingym serve`
writes them `bytes:\\xNN` (as OpenAI does), and the openai engine's 'standard' dialect maps
every token string back to its id. Before, such tokens came out as U+FFFD and the engine
raised TokenDrift on them (eval --engine openai against traingym serve, tiny tokenizer)."""

import asyncio

import pytest

from traingym.models.loader import tiny_tokenizer
from traingym.models.token_strings import parse_bytes, piece_ids, token_str, token_utf8
from traingym.rollout.openai_engine import OpenAIEngine
from traingym.core.types import GenerationRequest, SamplingParams


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()


def test_every_token_string_maps_back_to_its_id(tok):
    ids = piece_ids(tok)
    assert len(ids) == len(tok)  # no two ids share a string in this vocabulary
    assert all(ids[token_str(tok, i)] == i for i in range(len(tok)))
    text = "日本語 café 😀"
    pieces = tok(text, add_special_tokens=False)["input_ids"]
    strs = [token_str(tok, i) for i in pieces]
    assert any(s.startswith("bytes:") for s in strs) and "\ufffd" not in "".join(strs)
    assert b"".join(bytes(token_utf8(tok, i)) for i in pieces) == text.encode()
    assert parse_bytes("bytes:\\xe6\\x97") == b"\xe6\x97"
    assert parse_bytes("bytes:xyz") is None and parse_bytes("hello") is None


def test_standard_dialect_against_traingym_serve_maps_byte_pieces(ckpt_server):
    tok = tiny_tokenizer()
    engine = OpenAIEngine(OpenAIEngine.Options(base_url=ckpt_server.url + "/v1",
                                               dialect="standard"), tok)
    params = SamplingParams(1.0, max_new_tokens=24, stop_token_ids=(tok.eos_token_id,),
                            top_logprobs=2)
    reqs = [GenerationRequest(tuple(tok(f"What is {i} + {i}?")["input_ids"]), 2, params,
                              seed=i) for i in range(6)]
    out = asyncio.run(engine.generate(reqs))  # raised TokenDrift on byte pieces before
    engine.close()
    ids = [t for comps in out for c in comps for t in c.token_ids]
    partial = [t for t in set(ids) if "\ufffd" in tok.decode([t])]
    assert partial, "the sampled tokens should include byte pieces (the case that drifted)"
    for comps in out:
        for c in comps:
            assert len(c.top_logprobs) == len(c.token_ids)
            assert all(len(top) == 2 for top in c.top_logprobs)
