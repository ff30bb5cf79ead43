"""The built-in engine against Hugging Face generate and its own log-prob contract (tiny model)."""

import copy

import pytest
import torch

from traingym.models.loader import tiny_model, tiny_tokenizer
from traingym.core.padding import left_pad
from traingym.rollout import fused_decoder
from traingym.rollout.fused_decoder import FusedDecoder, packing_pays
from traingym.rollout.torch_engine import TorchEngine, draw
from traingym.core.types import GenerationRequest, SamplingParams


@pytest.fixture(scope="module")
def setup():
    tok = tiny_tokenizer()
    model = tiny_model(tok, seed=1).eval()
    prompts = [tuple(tok(f"What is {a} + {b}?")["input_ids"]) for a, b in [(1, 2), (13, 4), (7, 19)]]
    return tok, model, prompts


def test_greedy_matches_hf_generate(setup):
    tok, model, prompts = setup
    engine = TorchEngine(model, tok.pad_token_id)
    params = SamplingParams(temperature=0, max_new_tokens=6)
    out = engine.generate_sync([GenerationRequest(p, 1, params) for p in prompts])
    for p, comps in zip(prompts, out):
        ref = model.generate(torch.tensor([p]), max_new_tokens=6, do_sample=False,
                             min_new_tokens=6, pad_token_id=tok.pad_token_id)
        assert comps[0].token_ids == ref[0, len(p):].tolist()


def test_logprobs_are_those_of_the_sampling_distribution(setup):
    tok, model, prompts = setup
    engine = TorchEngine(model, tok.pad_token_id)
    params = SamplingParams(temperature=0.7, max_new_tokens=5)
    comps = engine.generate_sync([GenerationRequest(prompts[1], 3, params, seed=5)])[0]
    for c in comps:
        ids = torch.tensor([list(c.prompt_ids) + c.token_ids])
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0, len(c.prompt_ids) - 1 : -1] / 0.7
        ref = logits.log_softmax(-1).gather(-1, torch.tensor(c.token_ids)[:, None])[:, 0]
        assert torch.allclose(torch.tensor(c.logprobs), ref, atol=1e-4)


def test_seeded_samples_do_not_depend_on_batching(setup):
    tok, model, prompts = setup
    engine = TorchEngine(model, tok.pad_token_id)
    params = SamplingParams(temperature=1.0, top_k=50, top_p=0.9, max_new_tokens=5)
    together = engine.generate_sync([GenerationRequest(p, 2, params, seed=i) for i, p in enumerate(prompts)])
    alone = engine.generate_sync([GenerationRequest(prompts[2], 2, params, seed=2)])
    assert [c.token_ids for c in together[2]] == [c.token_ids for c in alone[0]]
    again = engine.generate_sync([GenerationRequest(prompts[2], 2, params, seed=3)])
    assert [c.token_ids for c in again[0]] != [c.token_ids for c in alone[0]]


def test_top_k_one_is_greedy_and_stop_tokens_end_rows(setup):
    tok, model, prompts = setup
    engine = TorchEngine(model, tok.pad_token_id)
    greedy = engine.generate_sync([GenerationRequest(prompts[0], 1, SamplingParams(0, max_new_tokens=6))])[0][0]
    topk1 = engine.generate_sync([GenerationRequest(prompts[0], 2, SamplingParams(1.0, top_k=1, max_new_tokens=6))])[0]
    assert all(c.token_ids == greedy.token_ids for c in topk1)
    stop = greedy.token_ids[2]
    stopped = engine.generate_sync([GenerationRequest(prompts[0], 1, SamplingParams(
        0, max_new_tokens=6, stop_token_ids=(stop,)))])[0][0]
    first = greedy.token_ids.index(stop)
    assert stopped.token_ids == greedy.token_ids[: first + 1] and stopped.finish_reason == "stop"
    assert greedy.finish_reason == "length" and len(greedy.token_ids) == 6


def test_max_batch_rows_splits_without_changing_results(setup):
    tok, model, prompts = setup
    params = SamplingParams(temperature=1.0, max_new_tokens=4)
    reqs = [GenerationRequest(p, 3, params, seed=i) for i, p in enumerate(prompts)]
    big = TorchEngine(model, tok.pad_token_id, max_batch_rows=64).generate_sync(reqs)
    small = TorchEngine(model, tok.pad_token_id, max_batch_rows=4).generate_sync(reqs)
    assert [[c.token_ids for c in g] for g in big] == [[c.token_ids for c in g] for g in small]


def test_update_weights_sets_version_and_rejects_unknown(setup):
    tok, model, _ = setup
    engine = TorchEngine(tiny_model(tok, seed=9), tok.pad_token_id)
    engine.update_weights(model.state_dict(), version=3)
    assert engine.version == 3
    assert torch.equal(engine.model.model.embed_tokens.weight, model.model.embed_tokens.weight)
    with pytest.raises(KeyError, match="no tensors"):
        engine.update_weights({"nope": torch.zeros(1)}, version=4)


def test_fused_path_matches_hf_path(setup):
    tok, model, prompts = setup
    fused = TorchEngine(model, tok.pad_token_id, fused=True)
    plain = TorchEngine(model, tok.pad_token_id, fused=False)
    assert fused.fused is not None and plain.fused is None
    params = SamplingParams(temperature=0.8, top_p=0.95, max_new_tokens=6)
    reqs = [GenerationRequest(p, 3, params, seed=i) for i, p in enumerate(prompts)]
    a, b = fused.generate_sync(reqs), plain.generate_sync(reqs)
    for ga, gb in zip(a, b):
        for ca, cb in zip(ga, gb):
            assert ca.token_ids == cb.token_ids
            assert torch.allclose(torch.tensor(ca.logprobs), torch.tensor(cb.logprobs), atol=1e-4)


def test_fused_path_matches_hf_path_for_a_one_token_prompt(setup):
    """A prefill of one token attends to that token only, not to the cache's empty slots (it
    took the decode branch, whose mask must span the whole cache, and was off by ~0.5 nats)."""
    tok, model, _ = setup
    fused = TorchEngine(model, tok.pad_token_id, fused=True)
    plain = TorchEngine(model, tok.pad_token_id, fused=False)
    req = GenerationRequest(tuple(tok.encode("What")), 1, SamplingParams(temperature=0,
                                                                          max_new_tokens=3))
    a, b = fused.generate_sync([req])[0][0], plain.generate_sync([req])[0][0]
    assert len(req.prompt_ids) == 1 and a.token_ids == b.token_ids
    assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-4)


def test_released_fused_weights_are_rebuilt_with_the_same_samples(setup):
    """release_derived drops the fused decoder's copies (the colocated loop does, while the
    trainer runs); the next generate rebuilds them, and samples are bitwise the same."""
    tok, model, prompts = setup
    engine = TorchEngine(model, tok.pad_token_id, fused=True)
    params = SamplingParams(temperature=0.8, max_new_tokens=6)
    reqs = [GenerationRequest(p, 2, params, seed=i) for i, p in enumerate(prompts)]
    before = engine.generate_sync(reqs)
    engine.release_derived()
    assert engine.fused.layers is None and engine.fused.lm_head is None
    after = engine.generate_sync(reqs)
    assert engine.fused.layers is not None
    assert [[(c.token_ids, c.logprobs) for c in g] for g in before] == \
        [[(c.token_ids, c.logprobs) for c in g] for g in after]


def _packed_and_plain(model, monkeypatch) -> tuple[FusedDecoder, FusedDecoder]:
    packed = FusedDecoder(model)
    with monkeypatch.context() as m:
        m.setattr(fused_decoder, "packing_pays", lambda w: False)
        plain = FusedDecoder(model)
    assert packed.packed and not plain.packed
    return packed, plain


def _prefill_then_decode(decoders, tok, prompts):
    """Each decoder's prompt logits, then its logits for one more token (the first decoder's
    greedy pick, for all)."""
    ids, mask = left_pad(list(prompts), tok.pad_token_id, torch.device("cpu"))
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    firsts = [d.prefill(ids, mask, pos, ids.shape[1] + 2) for d in decoders]
    tok_B = firsts[0][0].argmax(-1)
    mask = torch.cat([mask, torch.ones_like(mask[:, :1])], 1)
    return [(logits, d.decode(tok_B, pos[:, -1] + 1, cache, ids.shape[1], mask))
            for d, (logits, cache) in zip(decoders, firsts)]


@pytest.mark.skipif(not packing_pays(torch.zeros(1, dtype=torch.bfloat16)),
                    reason="this CPU's oneDNN build has no bf16 kernels, so weights are not packed")
def test_packed_bf16_weights_give_bitwise_identical_logits(setup, monkeypatch):
    tok, model, prompts = setup
    decoders = _packed_and_plain(copy.deepcopy(model).to(torch.bfloat16), monkeypatch)
    (la, da), (lb, db) = _prefill_then_decode(decoders, tok, prompts)
    assert torch.equal(la, lb)
    assert torch.equal(da, db)


@pytest.mark.skipif(not packing_pays(torch.zeros(1)),
                    reason="no oneDNN on this CPU, so fp32 weights are not packed")
def test_packed_fp32_weights_match_plain_linear_to_rounding(setup, monkeypatch):
    """fp32 packing runs oneDNN's kernel instead of MKL's: another summation order, so equal
    to ~1e-6, not bitwise; the packed weights are copies, rebuilt by refresh."""
    tok, model, prompts = setup
    fp32 = copy.deepcopy(model).float()
    decoders = _packed_and_plain(fp32, monkeypatch)
    (la, da), (lb, db) = _prefill_then_decode(decoders, tok, prompts)
    torch.testing.assert_close(la, lb, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(da, db, atol=1e-5, rtol=1e-5)
    with torch.no_grad():  # the packed copies follow a weight change through refresh
        for p in fp32.parameters():
            p.mul_(1.5)
    for d in decoders:
        d.refresh()
    (la2, da2), (lb2, db2) = _prefill_then_decode(decoders, tok, prompts)
    assert not torch.allclose(la2, la, atol=1e-3)
    torch.testing.assert_close(la2, lb2, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(da2, db2, atol=1e-5, rtol=1e-5)


def test_draw_samples_the_softmax_and_never_a_cut_token():
    logits = torch.tensor([[2.0, 1.0, float("-inf"), 0.0, -1.0, float("-inf")]])
    gens = [torch.Generator().manual_seed(7)]
    counts = torch.zeros(6)
    n = 20000
    for _ in range(n):
        counts[draw(logits, gens)] += 1
    p = logits.softmax(-1)[0]
    assert counts[2] == 0 and counts[5] == 0
    expected = n * p
    keep = expected > 0
    chi2 = (((counts - expected)[keep] ** 2) / expected[keep]).sum()
    assert chi2 < 16.3  # 3 degrees of freedom: P(chi2 > 16.3) ~ 0.001


def test_inflight_update_switches_weights_mid_decode_and_records_versions(setup):
    tok, model, prompts = setup
    params = SamplingParams(temperature=0, max_new_tokens=8)
    reqs = [GenerationRequest(p, 1, params) for p in prompts]
    before = TorchEngine(copy.deepcopy(model), tok.pad_token_id).generate_sync(reqs)
    engine = TorchEngine(copy.deepcopy(model), tok.pad_token_id)
    other = tiny_model(tok, seed=9).state_dict()
    forwards = []

    def between_steps():
        forwards.append(engine.version)
        if len(forwards) == 3:  # before the forward that gives the 4th token's logits
            engine.update_weights(other, version=1)

    engine.between_steps = between_steps
    out = engine.generate_sync(reqs)
    for old, new in zip(before, out):
        o, n = old[0], new[0]
        assert n.version == 0 and n.token_versions == [0, 0, 0] + [1] * (len(n.token_ids) - 3)
        assert n.token_ids[:3] == o.token_ids[:3] and n.logprobs[:3] == o.logprobs[:3]
        assert n.logprobs[3:] != o.logprobs[3:], "the new weights changed nothing: vacuous"
    plain = TorchEngine(copy.deepcopy(model), tok.pad_token_id).generate_sync(reqs)
    assert all(c[0].token_versions is None for c in plain)
