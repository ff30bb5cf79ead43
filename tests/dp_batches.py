"""Batches and comparisons for the data-parallel trainer's tests (tests/trainer, tests/cluster):
five groups of four samples on the tiny model's ids, split 3 + 2 over two ranks, with one
group whose completions are all one token long."""

from __future__ import annotations

import random

from traingym.core.types import Batch, Group, Sample

RTOL = 1e-5
# Weights after AdamW steps: an element whose gradient is near zero (|g| ~ AdamW's eps, 1e-8)
# moves by lr * g / (|g| + eps), so the ranks' other summation order (rounding of ~1e-10 in g)
# moves it by up to ~1e-3 of lr. At the tests' lr 1e-2 that was 1.3e-5 relative in one tensor
# (mlp.up_proj, torch 2.13 CPU), over RTOL. A rank's missing gradient differs by 1e-2 and more.
WEIGHTS_RTOL = 1e-4


def group(rng, index, lengths, vocab=300):  # the tiny tokenizer has ~300 ids
    prompt = tuple(rng.randrange(3, vocab) for _ in range(rng.randrange(3, 7)))
    samples = [Sample(prompt, [rng.randrange(3, vocab) for _ in range(n)], [0.0] * n, [0] * n,
                      {}) for n in lengths]
    return Group(samples, index)


def batch(seed: int) -> Batch:
    rng = random.Random(seed)
    lengths = [[3, 1, 4, 2], [2, 2, 1, 3], [1, 1, 1, 1], [4, 3, 2, 1], [2, 5, 1, 1]]
    groups = [group(rng, i, n) for i, n in enumerate(lengths)]  # rank 1 gets groups 3, 4
    return Batch(groups, [[rng.uniform(-1, 1) for _ in g.samples] for g in groups])


def rel(a: dict, b: dict) -> float:
    """The largest relative difference (L2) over the tensors of two state dicts."""
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).norm() / b[k].norm().clamp(min=1e-12)) for k in b)


def close(x: float, y: float) -> bool:
    """Relative 1e-5, or 1e-6 absolute: a GRPO loss at ratio 1 sums O(1) terms to about 0,
    so its float rounding is absolute, not relative."""
    return abs(x - y) <= RTOL * abs(y) + 1e-6
