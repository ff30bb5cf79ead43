"""Borrowed casts (trainer/casts.py): a bf16 autocast forward and backward that reads lent bf16
weights gives autocast's own log-probs and gradients bit for bit; in a colocated bf16 run the
sync lends the engine's tensors only while they are the casts of the trainer's weights."""

from __future__ import annotations

import pytest
import torch

import traingym
from traingym.loop.build import build_run
from traingym.models.loader import tiny_model, tiny_tokenizer
from traingym.trainer.casts import Borrowing, lending
from traingym.trainer.logprobs import completion_logprobs


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


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_borrowed_casts_give_autocasts_logprobs_and_grads_bitwise(temperature):
    tok = tiny_tokenizer()
    prompts, completions = _rows(tok)

    def run(borrow: bool, zero: bool = False):
        model = tiny_model(tok, seed=3).train()
        names = lending(model)
        params = dict(model.named_parameters())
        casts = {n: params[n].detach().to(torch.bfloat16) * (0 if zero else 1) for n in names}
        target = Borrowing(model, casts) if borrow else model
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = completion_logprobs(target, prompts, completions, temperature, 0)
        (out.logp_B_T.sum() + out.entropy_B_T.sum()).backward()
        return out.logp_B_T.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}, \
            names

    logp_a, grads_a, names = run(False)
    logp_b, grads_b, _ = run(True)
    assert names and all(".layers." in n or n.startswith("lm_head") for n in names)
    assert torch.equal(logp_a, logp_b)
    assert grads_a.keys() == grads_b.keys()
    for n in grads_a:
        assert torch.equal(grads_a[n], grads_b[n]), n
    logp_zero, _, _ = run(True, zero=True)  # the forward does read the lent tensors
    assert not torch.equal(logp_a, logp_zero)


def test_tied_embedding_is_not_lent():
    tok = tiny_tokenizer()
    model = tiny_model(tok, seed=3)
    names = lending(model)
    tied = model.get_output_embeddings().weight is model.get_input_embeddings().weight
    assert ("lm_head.weight" in names) == (not tied)
    assert "model.embed_tokens.weight" not in names


def test_the_sync_lends_the_engines_own_tensors_equal_to_the_casts(tmp_path):
    run, _ = _tiny_run(tmp_path / "run", 1, "bfloat16")
    try:
        names = lending(run.trainer.model)
        lent = run.weights.lent_casts(names)
        assert lent is not None and set(lent) == names
        engine = run.engine.model.state_dict()
        params = dict(run.trainer.model.named_parameters())
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
        assert run.weights.lent_casts(lending(run.trainer.model)) is None
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
