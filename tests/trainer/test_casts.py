"""Borrowed casts (trainer/casts.py): a bf16 autocast forward and backward that reads lent bf16
weights gives autocast's own log-probs, and its gradients to bf16 rounding (bit for bit where a
weight has one use); a run computes the same whether its engine lends the casts or the trainer
makes them; in a colocated bf16 run the sync lends the engine's tensors only while they are the
casts of the trainer's weights."""

from __future__ import annotations

import contextlib

import pytest
import torch

import traingym
from traingym.loop.build import build_run
from traingym.models.loader import tiny_model, tiny_tokenizer
from traingym.trainer.casts import Borrowing, lending, own_casts
from traingym.trainer.logprobs import completion_logprobs
from traingym.trainer.micro import sequence_logprobs


def _tiny_run(run_dir, steps: int, engine_dtype: str, **trainer):
    """A built colocated tiny run (no evaluations, no checkpoints) and its first step."""
    cfg = traingym.build_config("tiny", overrides={
        "steps": steps, "model": {"engine_dtype": engine_dtype}, "checkpoint": {"every": 0},
        "trainer": trainer, "eval": {"before": False, "after": False}})
    return build_run(cfg, run_dir, False, progress=False)


def _rows(tok):
    prompts = [tuple(tok(f"What is {a} + {b}?")["input_ids"]) for a, b in [(1, 2), (13, 4)]]
    completions = [[[5, 6, 7], [8, 9]], [[10, 11, 12, 13], [14]]]
    return prompts, completions


def _grads(borrow, temperature=1.0, scale=1.0, logprobs=completion_logprobs, ckpt=False):
    """Log-probs and fp32 gradients of the tiny model under bf16 autocast: borrowing the casts
    of its lent weights (times `scale`) or not."""
    tok = tiny_tokenizer()
    prompts, completions = _rows(tok)
    model = tiny_model(tok, seed=3).train()
    if ckpt:
        model.gradient_checkpointing_enable({"use_reentrant": False})
    uses = lending(model)
    casts = own_casts(model, set(uses.values()))
    lent = Borrowing(model, {u: casts[n] * scale for u, n in uses.items()}) if borrow \
        else contextlib.nullcontext()
    with lent:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = logprobs(model, prompts, completions, temperature, 0)
        (out.logp_B_T.sum() + out.entropy_B_T.sum()).backward()
    return out.logp_B_T.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_borrowed_casts_give_autocasts_logprobs_and_its_gradients_to_bf16_rounding(temperature):
    """The forward is autocast's bit for bit. The gradients differ only in rounding: each use's
    weight gradient is added into .grad in fp32, where autocast sums a weight's uses in bf16
    (the shared-prompt path calls the model twice) and a tied head's in fp32 with the
    embedding's before adding."""
    logp_a, grads_a = _grads(False, temperature)
    logp_b, grads_b = _grads(True, temperature)
    assert torch.equal(logp_a, logp_b)
    assert grads_a.keys() == grads_b.keys()
    for n in grads_a:
        err = (grads_a[n] - grads_b[n]).norm() / grads_a[n].norm()
        assert err < 1e-2, (n, float(err))
    logp_zero, _ = _grads(True, temperature, scale=0.0)  # the forward does read the lent tensors
    assert not torch.equal(logp_a, logp_zero)


def _layers_equal_rest_close(grads_a, grads_b):
    """Each decoder layer's gradients equal bit for bit; the tied embedding and head's (its
    uses summed in another order) to rounding."""
    for n in grads_a:
        if ".layers." in n:
            assert torch.equal(grads_a[n], grads_b[n]), n
        else:
            assert torch.allclose(grads_a[n], grads_b[n], rtol=1e-5, atol=1e-7), n


def test_one_call_gives_autocasts_gradients_of_the_layers_bit_for_bit():
    """With one model call (the full-row path) nothing is summed across uses: every weight of a
    decoder layer gets autocast's gradient exactly (the tied embedding and head are summed in
    another order, so to rounding)."""
    _, grads_a = _grads(False, logprobs=sequence_logprobs)
    _, grads_b = _grads(True, logprobs=sequence_logprobs)
    _layers_equal_rest_close(grads_a, grads_b)


def test_gradient_checkpointing_recomputes_on_the_lent_casts():
    """Borrowing stays entered through the backward, so the checkpoint's recompute runs the
    same forward (else torch refuses the recomputed tensors): under checkpointing, autocast's
    log-probs and layer gradients bit for bit, as without it."""
    logp_a, grads_a = _grads(False, logprobs=sequence_logprobs, ckpt=True)
    logp_b, grads_b = _grads(True, logprobs=sequence_logprobs, ckpt=True)
    assert torch.equal(logp_a, logp_b)
    _layers_equal_rest_close(grads_a, grads_b)


def test_shared_lending_hands_one_summed_gradient_on():
    """Without `accumulate` (the optimizer step in the backward needs each weight's whole
    gradient from autograd) every call shares one lent tensor per weight, as autocast's cache:
    autocast's gradients bit for bit, through .grad's own accumulation."""
    tok = tiny_tokenizer()
    prompts, completions = _rows(tok)

    def run(borrow):
        model = tiny_model(tok, seed=3).train()
        uses = lending(model)
        casts = own_casts(model, set(uses.values()))
        lent = Borrowing(model, {u: casts[n] for u, n in uses.items()}, accumulate=False) \
            if borrow else contextlib.nullcontext()
        with lent:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                out = completion_logprobs(model, prompts, completions, 1.0, 0)
            out.logp_B_T.sum().backward()
        return {n: p.grad.clone() for n, p in model.named_parameters()}

    a, b = run(False), run(True)
    for n in a:
        if ".layers." in n:
            assert torch.equal(a[n], b[n]), n


def test_a_tied_head_is_lent_and_the_embedding_lookup_reads_fp32():
    tok = tiny_tokenizer()
    model = tiny_model(tok, seed=3)
    tied = model.get_output_embeddings().weight is model.get_input_embeddings().weight
    assert tied  # the tiny model ties them, as SmolLM2 does
    uses = lending(model)
    assert uses["lm_head.weight"] == min("lm_head.weight", "model.embed_tokens.weight")
    assert not any(u.startswith("model.embed_tokens") for u in uses)
    ids = torch.tensor([[5, 6, 7]])
    zero = {u: torch.zeros_like(p, dtype=torch.bfloat16)
            for u, p in dict(model.named_parameters(remove_duplicate=False)).items()
            if u in uses}
    with Borrowing(model, zero):
        emb = model.get_input_embeddings()(ids)
        head = model.get_output_embeddings()(emb)
    assert torch.equal(emb, model.get_input_embeddings().weight[ids])
    assert emb.dtype == torch.float32 and not torch.equal(emb, torch.zeros_like(emb))
    assert torch.equal(head, torch.zeros_like(head))  # the head did read the lent zeros
    assert "forward" not in vars(model.get_output_embeddings())  # restored on exit


def test_the_sync_lends_the_engines_own_tensors_equal_to_the_casts(tmp_path):
    run, _ = _tiny_run(tmp_path / "run", 1, "bfloat16")
    try:
        names = set(lending(run.trainer.model).values())
        lent = run.weights.lent_casts(names)
        assert lent is not None and set(lent) == names
        engine = run.engine.model.state_dict()
        params = dict(run.trainer.model.named_parameters(remove_duplicate=False))
        for n, t in lent.items():
            assert t.data_ptr() == engine[n].data_ptr()  # the engine's own, no copy
            assert torch.equal(t, params[n].detach().to(torch.bfloat16))
        assert run.weights.lent_casts(names | {"model.embed_tokens.weight.nope"}) is None
    finally:
        run.close()


def test_a_loan_lasts_one_step(tmp_path):
    """The sync loop lends after each publish (and at its start); the step that writes the
    weights ends the loan, so no forward ever reads casts of older weights."""
    from traingym.loop.sync import train_loop

    run, start = _tiny_run(tmp_path / "run", 3, "bfloat16", bf16_autocast=True)
    trainer, seen = run.trainer, []
    step = trainer.train_step

    def watched(batch):
        seen.append(trainer._loan is not None)
        out = step(batch)
        seen.append(trainer._loan is not None)
        return out

    trainer.train_step = watched
    try:
        assert trainer._loan is None  # building a run lends nothing
        train_loop(run, start)
    finally:
        run.close()
    assert seen == [True, False] * 3


def test_a_float32_engine_lends_nothing(tmp_path):
    run, _ = _tiny_run(tmp_path / "run", 1, "float32")
    try:
        assert run.weights.lent_casts(set(lending(run.trainer.model).values())) is None
    finally:
        run.close()


def test_a_run_on_borrowed_casts_trains_bitwise_as_one_on_its_own(tmp_path):
    """Two steps of a colocated bf16 run (bf16 autocast on), borrowing and not: the same
    weights bit for bit, and every micro-batch of the borrowing run did borrow."""
    from traingym.loop.sync import train_loop

    def final(lend: bool, name: str):
        run, start = _tiny_run(tmp_path / name, 2, "bfloat16", bf16_autocast=True,
                               micro_batch_groups=1)
        lent, real = [], run.trainer.lend
        if lend:
            run.trainer.lend = lambda lender: real(
                lambda names: lent.append(lender(names)) or lent[-1])
        else:
            run.trainer.lend = lambda lender: None
        train_loop(run, start)
        weights = {k: v.clone() for k, v in run.trainer.export().items()}
        run.close()
        return weights, lent

    a, _ = final(False, "own")
    b, lent = final(True, "borrowed")
    assert len(lent) >= 2 and all(x is not None for x in lent)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_the_embedding_adds_its_rows_gradient_as_nn_embedding_computes_it():
    """Borrowing's lookup (`_Gather`) adds each looked-up row's gradient into .grad in place:
    nn.Embedding's gradient, repeated ids summed, the padding row left at 0, added to what
    .grad already holds."""
    torch.manual_seed(0)
    ref = torch.nn.Embedding(11, 4, padding_idx=3)
    emb = torch.nn.Embedding(11, 4, padding_idx=3)
    emb.load_state_dict(ref.state_dict())
    ids = torch.tensor([[1, 3, 1, 7], [3, 10, 0, 1]])
    upstream = torch.randn(2, 4, 4)
    for m in (ref, emb):
        m.weight.grad = torch.full_like(m.weight, 0.5)
    (ref(ids) * upstream).sum().backward()
    with Borrowing(emb, {}):
        out = emb(ids)
    (out * upstream).sum().backward()
    assert torch.equal(out, ref(ids))
    assert torch.allclose(emb.weight.grad, ref.weight.grad, rtol=0, atol=1e-6)
    assert torch.equal(emb.weight.grad[3], torch.full((4,), 0.5))
