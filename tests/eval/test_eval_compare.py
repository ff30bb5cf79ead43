"""`traingym eval`: --compare on a tiny run's base model and final checkpoint reproduces the run's
own before/after figure exactly (same rows, seed, engine and weights: the comparison is held to
equality, tolerance 0); eval folders hold per-sample records; comparing two eval folders gives
the same result; eval prompts that trained the run under test are refused."""

from __future__ import annotations

import json

import pytest

import traingym
from traingym.cli import main


def _eval_records(folder):
    return [json.loads(ln) for ln in (folder / "samples.jsonl").read_text().splitlines()]


def test_compare_reproduces_the_runs_before_after(tiny_run, tmp_path, capsys):
    out = tmp_path / "cmp"
    final = tiny_run / "checkpoints" / "step_000004"
    assert main(["eval", "--compare", "base", str(final), "--out", str(out)]) == 0
    res = json.loads((out / "compare.json").read_text())
    run = json.loads((tiny_run / "results.json").read_text())["eval"]
    assert set(run["delta"]) == {"greedy", "sampled"}
    for metric in ("greedy", "sampled"):
        assert res["delta"][metric] == run["delta"][metric]  # exactly
        assert res["a_scores"][metric] == run["before"][metric]
        assert res["b_scores"][metric] == run["after"][metric]
    # per prompt, not only the means
    before = json.loads((tiny_run / "eval_before.json").read_text())
    after = json.loads((tiny_run / "eval_after.json").read_text())
    a = json.loads((out / "a" / "summary.json").read_text())
    b = json.loads((out / "b" / "summary.json").read_text())
    assert a["scores"]["sampled"]["per_prompt"] == before["sampled"]["per_prompt"]
    assert b["scores"]["sampled"]["per_prompt"] == after["sampled"]["per_prompt"]
    assert b["model"]["checkpoint"] == str(final) and a["model"]["model_path"] == "tiny"
    assert b["overlap"] == {"checked": True, "run_dir": str(tiny_run), "overlapping_prompts": 0,
                            "training_rows": b["overlap"]["training_rows"]}
    # per-sample records: 16 prompts x (1 greedy + 2 sampled)
    recs = _eval_records(out / "b")
    assert len(recs) == 16 * 3
    assert {r["mode"] for r in recs} == {"greedy", "sampled"}
    r = recs[-1]
    assert set(r) >= {"prompt", "completion", "reward", "prompt_ids", "completion_ids",
                      "prompt_index", "sample", "passed", "example"}
    sampled = [x for x in recs if x["mode"] == "sampled"]
    per_prompt = {}
    for x in sampled:
        per_prompt.setdefault(x["prompt_index"], []).append(x["reward"])
    assert [sum(v) / len(v) for _, v in sorted(per_prompt.items())] == \
        b["scores"]["sampled"]["per_prompt"]
    printed = capsys.readouterr().out
    assert "change B - A (paired over 16 prompts)" in printed

    # two eval folders compare to the same figures without evaluating again
    again = traingym.compare_evals(out / "a", out / "b")
    assert again["delta"] == res["delta"]


def test_run_dir_means_its_latest_checkpoint_and_api_matches(tiny_run, tmp_path):
    res = traingym.evaluate(tiny_run, out=tmp_path / "ev", pass_k=(1, 2), pass_threshold=0.5)
    after = json.loads((tiny_run / "eval_after.json").read_text())
    assert res.scores["sampled"].per_prompt == after["sampled"]["per_prompt"]
    assert res.summary["model"]["checkpoint"].endswith("step_000004")
    recs = _eval_records(tmp_path / "ev")
    passed = {}
    for x in recs:
        if x["mode"] == "sampled":
            passed.setdefault(x["prompt_index"], []).append(x["reward"] >= 0.5)
    # pass@2 of 2 samples: 1 if any passed
    want = [float(any(v)) for _, v in sorted(passed.items())]
    assert res.scores["pass@2"].per_prompt == want
    assert res.scores["pass@1"].per_prompt == [sum(v) / 2 for _, v in sorted(passed.items())]


def test_overlap_with_training_prompts_is_refused(tiny_run, tmp_path, capsys):
    # 32 held-out prompts: the built-in split moves 16 of the run's training rows into them
    code = main(["eval", str(tiny_run), "--set", "eval.num_prompts=32",
                 "--out", str(tmp_path / "x")])
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("traingym: 16 of 32 eval prompts were "
                                                   "training prompts of run")
    assert "--allow-overlap" in err
    assert not (tmp_path / "x").exists()
    # a dataset of training rows, through the API
    from traingym.envs.tasks import builtin_task, digit_fraction

    train_rows = builtin_task("arith", num_heldout=16).train[:5]
    with pytest.raises(traingym.ConfigError, match="5 of 5 eval prompts"):
        traingym.evaluate(tiny_run / "checkpoints" / "step_000002", dataset=train_rows,
                          reward=digit_fraction)
    # on purpose: allowed, and recorded
    res = traingym.evaluate(tiny_run, dataset=train_rows, reward=digit_fraction,
                            allow_overlap=True)
    assert res.summary["overlap"]["overlapping_prompts"] == 5
    # the base model has no training prompts to check
    assert traingym.evaluate("tiny", dataset=train_rows,
                             reward=digit_fraction).summary["overlap"]["checked"] is False


def test_bad_input_is_one_line(tiny_run, tmp_path, capsys):
    cases = [
        (["eval", str(tmp_path / "missing")], "no such file or folder"),
        (["eval", str(tiny_run), "--pass-k", "3"], "needs 1 <= k <= eval.samples_per_prompt"),
        (["eval", "tiny", "--engine", "torhc"], "did you mean 'torch'"),
        (["eval", "--compare", "base", "tiny"], "'base' means the base model of the other"),
        (["eval", str(tiny_run), "--out", str(tiny_run)], "is not empty"),
    ]
    for argv, needle in cases:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("traingym: ") and needle in err, err


def test_any_registered_engine_path(tmp_path):
    # a second engine named by its 'module:Class' path (tests/toy_engine.py) evaluates too
    res = traingym.evaluate("tiny", engine="toy_engine:RecomputeEngine",
                            config=traingym.build_config("tiny"))
    ref = traingym.evaluate("tiny", config=traingym.build_config("tiny"))
    assert res.summary["engine"] == "toy_engine:RecomputeEngine"
    assert res.scores["greedy"].n_prompts == ref.scores["greedy"].n_prompts == 16
    # greedy decoding is the argmax under both engines: the same completions
    greedy = [r["completion_ids"] for r in res.records if r["mode"] == "greedy"]
    assert greedy == [r["completion_ids"] for r in ref.records if r["mode"] == "greedy"]
