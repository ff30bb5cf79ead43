"""The paired z-score is None when the standard error is float noise (every prompt's difference
equal up to rounding), and every printer shows such a z as 'n/a' (issue 27 item 6)."""

import json
import random

import pytest

from traingym.dashboard.report import _heldout
from traingym.envs.evaluate import Score, _score, paired_difference, z_score, z_text
from traingym.eval.run import format_delta, paired


def _pair(after: list[float], before: list[float]) -> dict:
    return paired_difference(_score(after), _score(before))


def test_equal_differences_up_to_rounding_have_no_z():
    rng = random.Random(0)
    before = [rng.random() for _ in range(24)]
    after = [b + 2 / 3 for b in before]  # the same gain on every prompt, rounded differently
    d = _pair(after, before)
    assert d["delta"] == pytest.approx(2 / 3) and 0 < d["se"] < 1e-15  # float noise
    assert d["z"] is None
    assert _pair([2 / 3] * 3, [0.0] * 3)["z"] is None  # exactly equal: se 0


def test_a_real_spread_keeps_its_z():
    d = _pair([1.0, 0.5, 1.0, 0.0], [0.0, 0.0, 0.5, 0.0])  # diffs 1, 0.5, 0.5, 0
    assert d["z"] == pytest.approx(d["delta"] / d["se"]) and d["z"] == pytest.approx(2.449, 1e-3)
    assert _pair([0.0], [0.0])["z"] is None  # one prompt: no standard error


@pytest.mark.parametrize("mean,se,z", [(0.5, 0.1, 5.0), (-0.5, 0.25, -2.0), (0.5, 0.0, None),
                                       (0.5, None, None), (0.67, 2e-17, None),
                                       (1e6, 1e-4, None), (1e6, 1e4, 100.0), (0.0, 0.1, 0.0)])
def test_z_score(mean, se, z):
    assert z_score(mean, se) == (pytest.approx(z) if z is not None else None)


OLD = {"delta": 0.6666666666666667, "se": 1.994019416548808e-17, "z": 3.343330867963735e16}


def test_printers_show_no_z_as_n_a():
    assert z_text({"delta": 0.3, "se": 0.1, "z": 3.0}) == " (3.0 SE)"
    assert z_text({"delta": 0.0, "se": 0.0, "z": None}) == " (z n/a)"
    assert z_text(OLD) == " (z n/a)"  # a file written before: its z of 3e16 is not printed
    line = format_delta({"greedy": OLD, "sampled": {"delta": 0.3, "se": 0.1, "z": 3.0}})
    assert line == "greedy +0.667 ± 0.000 (z n/a)  sampled +0.300 ± 0.100 (3.0 SE)"


def test_eval_compare_of_equal_differences():
    def summary(model, per_prompt):
        s = Score(sum(per_prompt) / 3, 0.0, 3, per_prompt)
        return {"model": model, "prompts_sha256": "x", "num_prompts": 3, "seed": 0,
                "scores": {"greedy": {"mean": s.mean, "se": s.se, "n_prompts": 3,
                                      "per_prompt": per_prompt}}}

    out = paired(summary("a", [0.1, 0.2, 0.3]), summary("b", [0.1 + 2 / 3, 0.2 + 2 / 3,
                                                                0.3 + 2 / 3]))
    assert out["delta"]["greedy"]["z"] is None
    assert "(z n/a)" in format_delta(out["delta"])


@pytest.mark.parametrize("z", [None, OLD["z"]])
def test_report_shows_no_z_as_n_a(tmp_path, z):
    score = {"mean": 0.5, "se": 0.1, "n_prompts": 3}
    for name in ("eval_before.json", "eval_after.json"):
        (tmp_path / name).write_text(json.dumps({"greedy": score}))
    (tmp_path / "results.json").write_text(json.dumps(
        {"eval": {"delta": {"greedy": {**OLD, "z": z}}}}))
    html = _heldout(tmp_path)
    assert "+0.667 ± 0.000 (z n/a)" in html and "e+16" not in html and "SE)" not in html
