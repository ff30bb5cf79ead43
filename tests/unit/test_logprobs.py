"""The shared-prefix log-prob pass equals one full sequence per sample, values and gradients."""

import pytest
import torch

from traingym.models.loader import tiny_model, tiny_tokenizer
from traingym.trainer.logprobs import completion_logprobs


def _naive(model, prompts, completions, temperature, pad):
    rows = []
    for p, group in zip(prompts, completions):
        for c in group:
            ids = torch.tensor([list(p) + list(c)])
            logits = model(input_ids=ids).logits[0] / temperature
            lp = logits.log_softmax(-1)[len(p) - 1 : len(p) + len(c) - 1]
            rows.append(lp.gather(-1, torch.tensor(c)[:, None])[:, 0])
    width = max(len(r) for r in rows)
    return torch.stack([torch.nn.functional.pad(r, (0, width - len(r))) for r in rows])


def test_shared_prefix_matches_full_sequences():
    tok = tiny_tokenizer()
    model = tiny_model(tok, seed=3).double()
    prompts = [(5, 6, 7, 8, 9), (10, 11, 12), (13,)]
    completions = [[[20, 21, 22], [23], [24, 25]], [[26, 27], [28, 29, 30, 31]], [[32], [33]]]
    out = completion_logprobs(model, prompts, completions, 0.7, tok.pad_token_id)
    ref = _naive(model, prompts, completions, 0.7, tok.pad_token_id)
    assert torch.allclose(out.logp_B_T, ref, atol=1e-10)
    expected_mask = [[1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 0, 0], [1, 1, 1, 1],
                     [1, 0, 0, 0], [1, 0, 0, 0]]
    assert out.mask_B_T.tolist() == expected_mask

    out.logp_B_T.sum().backward()
    shared = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    _naive(model, prompts, completions, 0.7, tok.pad_token_id).sum().backward()
    for g_shared, p in zip(shared, model.parameters()):
        # HF's RMSNorm computes in float32 even in a float64 model: agreement is to ~1e-6.
        assert torch.allclose(g_shared, p.grad, rtol=1e-5, atol=2e-6), \
            (g_shared - p.grad).abs().max()


def test_the_lm_head_never_sees_a_strided_slice():
    """HF's logits_to_keep hands the LM head a strided view of the hidden states; torch.matmul
    then expands and copies the head's weight once per row (models/scoring.py
    contiguous_head_input). Every LM head input of the trainer's passes is contiguous."""
    from traingym.models.scoring import row_logits

    tok = tiny_tokenizer()
    model = tiny_model(tok, seed=3)
    seen = []
    model.get_output_embeddings().register_forward_hook(
        lambda module, args, out: seen.append(args[0].is_contiguous()))
    prompts = [(5, 6, 7, 8, 9), (10, 11, 12)]
    completions = [[[20, 21, 22], [23]], [[26, 27], [28, 29, 30, 31]]]
    completion_logprobs(model, prompts, completions, 1.0, tok.pad_token_id)
    row_logits(model, [p for p, g in zip(prompts, completions) for _ in g],
               [c for g in completions for c in g], tok.pad_token_id)
    assert len(seen) == 3 and all(seen)


def test_short_rows_run_the_math_attention_kernel_and_long_rows_torchs_choice(monkeypatch):
    """On a CPU the trainer's passes over rows of at most MATH_ATTENTION_TOKENS tokens run
    SDPA's math kernel (models/scoring.py short_rows_attention; flash costs ~3x there, measured
    by benchmarks/attention_kernels.py); longer rows keep torch's own choice. Seen from the
    kernels' flags at every attention call, and the log-probs stay those of full rows."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from traingym.models import scoring

    tok = tiny_tokenizer()
    model = tiny_model(tok, seed=3)
    seen = []
    real = torch.nn.functional.scaled_dot_product_attention

    def spy(*args, **kwargs):
        seen.append(torch.backends.cuda.flash_sdp_enabled())  # the flags are device-agnostic
        return real(*args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    prompts, completions = [(5, 6, 7, 8, 9), (10, 11)], [[[20, 21, 22], [23]], [[26, 27]]]
    short = completion_logprobs(model, prompts, completions, 1.0, tok.pad_token_id)
    assert seen and not any(seen)  # the math kernel only
    seen.clear()
    monkeypatch.setattr(scoring, "MATH_ATTENTION_TOKENS", 4)  # these rows are now "long"
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
        long = completion_logprobs(model, prompts, completions, 1.0, tok.pad_token_id)
    assert seen and all(seen)
    assert torch.allclose(short.logp_B_T, long.logp_B_T, atol=1e-5)
    assert torch.allclose(short.logp_B_T, _naive(model, prompts, completions, 1.0,
                                                 tok.pad_token_id), atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("temperature", [1.0, 0.7, 0.0])
def test_vocab_terms_equal_log_softmax_gather_and_entropy(monkeypatch, dtype, temperature):
    """The chunked log-prob and entropy (values and both gradients) against log_softmax,
    gather and -(p log p).sum() over the whole vocabulary, with chunks that split the rows."""
    from traingym.trainer import logprobs

    monkeypatch.setattr(logprobs, "ROWS_PER_CHUNK", 4)
    gen = torch.Generator().manual_seed(0)
    x = (torch.randn(3, 5, 300, generator=gen) * 4).to(dtype).requires_grad_()
    ids = torch.randint(0, 300, (3, 5), generator=gen)
    g_logp, g_ent = torch.randn(3, 5, generator=gen), torch.randn(3, 5, generator=gen)
    lp, ent = logprobs.token_logprobs_and_entropy(x, ids, temperature)
    z = x.float() / temperature if temperature not in (0.0, 1.0) else x.float()
    ls = z.log_softmax(-1)
    lp_ref, ent_ref = ls.gather(-1, ids[..., None])[..., 0], -(ls.exp() * ls).sum(-1)
    assert lp.dtype == ent.dtype == torch.float32
    torch.testing.assert_close(lp, lp_ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ent, ent_ref, atol=1e-5, rtol=1e-5)
    for with_entropy in (False, True):
        got, = torch.autograd.grad((lp * g_logp).sum() + with_entropy * (ent * g_ent).sum(), x,
                                   retain_graph=True)
        want, = torch.autograd.grad((lp_ref * g_logp).sum()
                                    + with_entropy * (ent_ref * g_ent).sum(), x,
                                    retain_graph=True)
        assert got.dtype == dtype
        scale = want.float().abs().max()
        assert (got.float() - want.float()).abs().max() <= 1e-5 * scale + (
            0 if dtype == torch.float32 else scale * 2**-8)
