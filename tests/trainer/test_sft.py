"""SFT: the assistant-only mask on a hand-made conversation; an SFT phase then RL in one
config and run directory; resume across the phase boundary is exact."""

import json

import torch
from prereq import require
from safetensors.torch import load_file

import traingym
from traingym.models.loader import tiny_tokenizer
from traingym.observability.events import read_events
from traingym.trainer.sft import assistant_mask, batch_rows


def test_mask_covers_assistant_turns_only():
    tok = tiny_tokenizer()
    msgs = [{"role": "system", "content": "Be brief."},
            {"role": "user", "content": "What is 2 + 3?"},
            {"role": "assistant", "content": "5"},
            {"role": "user", "content": "And 4 * 4?"},
            {"role": "assistant", "content": "16"}]
    ids, mask = assistant_mask(tok, msgs)
    assert len(ids) == len(mask)
    full = tok.decode(ids)
    assert full == tok.apply_chat_template(msgs, tokenize=False)
    # the masked tokens, run by run, are exactly the two assistant turns with end of turn
    runs, cur = [], []
    for i, m in zip(ids, mask):
        if m:
            cur.append(i)
        elif cur:
            runs.append(tok.decode(cur))
            cur = []
    if cur:
        runs.append(tok.decode(cur))
    assert runs == ["5<|im_end|>\n", "16<|im_end|>\n"]
    # the headers and user turns are context
    assert tok.decode([i for i, m in zip(ids, mask) if not m]).count("<|im_start|>") == 5


def _chats(path):
    rows = [{"messages": [{"role": "user", "content": f"What is {a} + {b}?"},
                          {"role": "assistant", "content": f"The answer is {a + b}."}]}
            for a in range(6) for b in range(6)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def _cfg(data, steps):
    return traingym.build_config("tiny", overrides={
        "steps": steps, "checkpoint": {"every": 1},
        "eval": {"before": False, "after": False},
        "sft": {"data": data, "steps": 6, "batch_size": 6, "lr": 3e-3,
                "checkpoint_every": 3}})


def test_sft_then_rl_in_one_run_and_resume_across_the_boundary(tmp_path):
    data = _chats(tmp_path / "chats.jsonl")
    straight = traingym.train(_cfg(data, 2), run_dir=tmp_path / "s", progress=False)
    ev = read_events(straight.run_dir)
    sft = [e for e in ev if e.get("phase") == "sft"]
    rl = [e for e in ev if e.get("phase") != "sft"]
    assert [e["sft_step"] for e in sft] == [1, 2, 3, 4, 5, 6]
    assert sft[-1]["loss"] < sft[0]["loss"]  # the warm start learns the chats
    assert [e["step"] for e in rl] == [1, 2]
    # stopped after the SFT phase (steps=1 would run one RL step: stop in the phase instead)
    split = tmp_path / "r"
    cfg = _cfg(data, 2)
    import traingym.loop.sft as sft_mod

    real = sft_mod.total_steps
    try:  # a run whose SFT phase is cut after 3 steps (its checkpoint), then resumed
        sft_mod.total_steps = lambda c, n: 3
        traingym.train(cfg.model_copy(update={"steps": 1}), run_dir=split, progress=False)
    finally:
        sft_mod.total_steps = real
    state = json.loads((split / "checkpoints/step_000000/state.json").read_text())
    assert state["phase"] == "sft" and state["sft_step"] == 3
    # drop the RL step it ran, so the resume continues the phase from its checkpoint
    import shutil

    shutil.rmtree(split / "checkpoints/step_000001")
    traingym.train(cfg, run_dir=split, resume=True, progress=False)
    a, b = straight.run_dir / "checkpoints/step_000002", split / "checkpoints/step_000002"
    for name in ("model.safetensors", "optimizer.safetensors"):
        ta, tb = load_file(a / name), load_file(b / name)
        assert all(torch.equal(ta[k], tb[k]) for k in ta), name
    eb = read_events(split)
    assert [e["sft_step"] for e in eb if e.get("phase") == "sft"] == [1, 2, 3, 4, 5, 6]


def test_batch_order_is_seeded_and_covers_each_epoch():
    first = [i for k in range(6) for i in batch_rows(36, 0, k, 6)]
    assert sorted(first) == list(range(36))
    assert batch_rows(36, 0, 2, 6) == batch_rows(36, 0, 2, 6)


def test_chats_from_a_datasets_folder_and_bad_rows(tmp_path):
    import pytest

    datasets = require("datasets", "a datasets folder needs the datasets package (test extra)")
    from traingym.envs.datasets import DatasetError
    from traingym.trainer.sft import load_chats

    msgs = [{"role": "user", "content": "1 + 1?"}, {"role": "assistant", "content": "2"}]
    datasets.Dataset.from_list([{"messages": msgs}] * 3).save_to_disk(str(tmp_path / "ds"))
    assert load_chats(str(tmp_path / "ds")) == [msgs] * 3
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}]}) + "\n")
    with pytest.raises(DatasetError, match="row 1 has no assistant message"):
        load_chats(str(bad))
    bad.write_text(json.dumps({"prompt": "hi"}) + "\n")
    with pytest.raises(DatasetError, match="row 1 needs 'messages'"):
        load_chats(str(bad))
