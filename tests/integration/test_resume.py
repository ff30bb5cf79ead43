"""N steps straight equals N/2 + resume + N/2: parameters, optimizer state and metrics."""

import json

import torch
from safetensors.torch import load_file

import traingym
from traingym.observability.events import read_events

# Timings (utilisation from the trace included), and the weight sync's choices: a resumed
# publisher starts a new chain with an anchor, so its codec and bytes differ from the
# straight run's (the weights do not).
TIMING = ("seconds_", "tokens_per_s", "gen_tokens_per_s", "elapsed_s", "checkpoint_saved",
          "sync_", "util_", "wait_")


def _cfg(steps):
    return traingym.build_config("tiny", overrides={
        "steps": steps, "checkpoint": {"every": 3}, "eval": {"before": False, "after": False}})


def _untimed(events):
    return [{k: v for k, v in e.items() if not k.startswith(TIMING)} for e in events]


def test_resume_is_bitwise_identical(tmp_path):
    straight, split = tmp_path / "straight", tmp_path / "split"
    traingym.train(_cfg(6), run_dir=straight, progress=False)
    traingym.train(_cfg(3), run_dir=split, progress=False)
    traingym.train(_cfg(6), run_dir=split, resume=True, progress=False)

    a, b = straight / "checkpoints/step_000006", split / "checkpoints/step_000006"
    for name in ("model.safetensors", "optimizer.safetensors"):
        ta, tb = load_file(a / name), load_file(b / name)
        assert ta.keys() == tb.keys()
        for key in ta:
            assert torch.equal(ta[key], tb[key]), f"{name}:{key} differs"
    assert json.loads((a / "optimizer.json").read_text()) == json.loads((b / "optimizer.json").read_text())
    ea, eb = _untimed(read_events(straight)), _untimed(read_events(split))
    assert [e["step"] for e in eb] == [1, 2, 3, 4, 5, 6]
    assert ea == eb
    assert any(e["groups_kept"] > 0 for e in ea), "the run never trained: the test would be vacuous"
