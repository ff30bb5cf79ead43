"""pass@k (evaluate.py) against the closed form 1 - C(n-c, k)/C(n, k) of Chen et al. 2021,
computed exactly with integers, on constructed counts; and the mean/SE over prompts."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest

from traingym.envs.evaluate import pass_at_k, pass_at_k_score


def closed_form(n: int, c: int, k: int) -> Fraction:
    return 1 - Fraction(math.comb(n - c, k), math.comb(n, k))


def test_matches_closed_form_on_every_small_case():
    cases = 0
    for n in range(1, 16):
        for c in range(0, n + 1):
            for k in range(1, n + 1):
                assert pass_at_k(n, c, k) == pytest.approx(float(closed_form(n, c, k)),
                                                           rel=1e-12, abs=1e-15), (n, c, k)
                cases += 1
    assert cases == sum(n * (n + 1) for n in range(1, 16))


def test_large_n_is_stable():
    # C(1000, 100) overflows a float; the product form does not
    for n, c, k in ((1000, 3, 100), (1000, 1, 1), (500, 250, 10), (200, 0, 50), (200, 199, 2)):
        assert pass_at_k(n, c, k) == pytest.approx(float(closed_form(n, c, k)), rel=1e-9)


def test_edge_cases():
    assert pass_at_k(5, 5, 1) == 1.0  # n = c: every sample passes
    assert pass_at_k(5, 5, 5) == 1.0
    assert pass_at_k(5, 0, 1) == 0.0  # c = 0: none passes
    assert pass_at_k(5, 0, 5) == 0.0
    assert pass_at_k(5, 1, 5) == 1.0  # k = n with one passing: the draw holds it
    assert pass_at_k(4, 1, 1) == 0.25  # pass@1 is the fraction passing
    with pytest.raises(ValueError, match="needs at least 6 samples per prompt"):
        pass_at_k(5, 2, 6)  # k > n refused
    with pytest.raises(ValueError):
        pass_at_k(5, 6, 1)
    with pytest.raises(ValueError):
        pass_at_k(5, 1, 0)


def test_score_over_prompts():
    passed = [[True, False, False, False], [True, True, False, False], [False] * 4]
    s = pass_at_k_score(passed, 2)
    per = [float(closed_form(4, c, 2)) for c in (1, 2, 0)]
    assert s.per_prompt == pytest.approx(per)
    mean = sum(per) / 3
    assert s.mean == pytest.approx(mean)
    sd = math.sqrt(sum((x - mean) ** 2 for x in per) / 2)
    assert s.se == pytest.approx(sd / math.sqrt(3))
    with pytest.raises(ValueError):
        pass_at_k_score(passed, 5)
