"""Held-out evaluation: mean reward, greedy and sampled, with standard errors over prompts.

Standard errors are over per-prompt means (samples of one prompt are correlated); comparisons
on the same prompts use the paired difference. pass@k is Chen et al. 2021's unbiased
1 - C(n-c, k) / C(n, k), computed as a product (no huge binomials); a sample passes when its
reward reaches a threshold (1.0 by default). `traingym.evaluate(model, ...)` is eval/run.py's
`evaluate`, built on this.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from traingym.core.types import SamplingParams
from traingym.envs.base import EnvFactory
from traingym.envs.group import GroupReward
from traingym.envs.resources import RunResources
from traingym.envs.runner import EpisodeLimits, RolloutRunner


@dataclass
class Score:
    mean: float
    se: float
    n_prompts: int
    per_prompt: list[float]

    def summary(self) -> dict:
        return {"mean": self.mean, "se": self.se, "n_prompts": self.n_prompts}


def _score(per_prompt: list[float]) -> Score:
    """Mean and standard error over prompts; a NaN entry (a prompt whose every sample was
    dropped, `group_means`) keeps its place in `per_prompt` but is not counted."""
    counted = [x for x in per_prompt if not math.isnan(x)]
    n = len(counted)
    if n == 0:
        raise ValueError(f"no prompt left to score: all {len(per_prompt)} had every sample "
                         "dropped (a judge with on_failure='drop' failed on all of them); fix "
                         "the judge or use on_failure='score:<x>'")
    mean = sum(counted) / n
    var = sum((x - mean) ** 2 for x in counted) / (n - 1) if n > 1 else 0.0
    return Score(mean, math.sqrt(var / n), n, per_prompt)


def paired_difference(after: Score, before: Score) -> dict:
    """after - before per prompt, over the prompts counted in both (a NaN in either: skipped):
    {'delta', 'se', 'z'}, z None when every difference is equal or the standard error is
    within float noise of zero (`z_score`)."""
    if len(after.per_prompt) != len(before.per_prompt):
        raise ValueError(f"paired difference: {len(after.per_prompt)} prompts after but "
                         f"{len(before.per_prompt)} before; pair evaluations of the same prompts")
    diffs = [a - b for a, b in zip(after.per_prompt, before.per_prompt)
             if not (math.isnan(a) or math.isnan(b))]
    if not diffs:
        raise ValueError(f"paired difference: no prompt is counted in both evaluations (after: "
                         f"{after.n_prompts} of {len(after.per_prompt)}, before: "
                         f"{before.n_prompts} of {len(before.per_prompt)}; the rest had every "
                         "sample dropped): nothing to compare; fix the judge or use "
                         "on_failure='score:<x>'")
    s = _score(diffs)
    return {"delta": s.mean, "se": s.se,
            "z": None if max(diffs) == min(diffs) else z_score(s.mean, s.se)}


# a standard error at or below this x max(1, |mean|) is rounding noise, not spread
SE_NOISE = 1e-9


def z_score(mean: float, se: float | None) -> float | None:
    """mean / se, or None when the standard error is within float noise of zero (every
    difference equal up to rounding: 2/3 - 0 on every prompt gives se ~ 1e-17 and a
    meaningless z of 3e16) or absent. Printers show None as 'z n/a'."""
    if se is None or not se > SE_NOISE * max(1.0, abs(mean)):
        return None
    return mean / se


def z_text(d: dict) -> str:
    """' (z SE)' of a paired difference {'delta', 'se', 'z'}, or ' (z n/a)' when its z is
    None or comes from a standard error within float noise of zero (files written before
    z_score). Recomputed from delta and se, so an old file's z of 3e16 is not printed."""
    z = z_score(d["delta"], d.get("se")) if d.get("z") is not None else None
    return f" ({z:.1f} SE)" if z is not None else " (z n/a)"


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k for one prompt with `n` samples of which `c` pass (Chen et al. 2021):
    1 - C(n-c, k)/C(n, k) = 1 - prod_{i=n-c+1..n} (1 - k/i). k > n cannot be estimated from n
    samples: a ValueError, as is a count outside 0..n."""
    if k < 1 or n < 1:
        raise ValueError(f"pass@k needs k >= 1 and n >= 1 samples, got k={k}, n={n}")
    if k > n:
        raise ValueError(f"pass@{k} needs at least {k} samples per prompt, got {n}: raise the "
                         f"samples per prompt to >= {k} or lower k")
    if not 0 <= c <= n:
        raise ValueError(f"pass@k: {c} passing samples out of {n} is impossible")
    if n - c < k:  # every draw of k samples holds a passing one
        return 1.0
    prod = 1.0
    for i in range(n - c + 1, n + 1):
        prod *= 1.0 - k / i
    return 1.0 - prod


def pass_at_k_score(passed_per_prompt: list[list[bool]], k: int) -> Score:
    """Mean pass@k over prompts, standard error over prompts. A prompt left with fewer than k
    samples (the others dropped: Sample.drop_reason) is NaN, not counted (`_score`)."""
    return _score([pass_at_k(len(p), sum(p), k) if len(p) >= k else math.nan
                   for p in passed_per_prompt])


def collect(engine, factory: EnvFactory, rows: list[dict], temperature: float,
            samples: int, max_new_tokens: int, stop_ids: tuple[int, ...], seed: int, *,
            tokenizer, limits: EpisodeLimits = EpisodeLimits(),
            group_reward: GroupReward | None = None,
            resources: RunResources | None = None) -> list:
    """`samples` scored episodes per row at `temperature` (0: greedy): one Group per row, in
    row order, seeded by (seed, row position) as `evaluate` does."""
    params = SamplingParams(temperature=temperature, max_new_tokens=max_new_tokens,
                            stop_token_ids=stop_ids)
    runner = RolloutRunner(engine, factory, params, samples, tokenizer=tokenizer, limits=limits,
                           group_reward=group_reward, resources=resources)
    try:
        return runner.collect(list(enumerate(rows)), seed)
    finally:
        runner.close()


def group_means(groups: list) -> Score:
    """Mean reward per prompt over its samples, leaving out samples marked dropped
    (Sample.drop_reason: a failed judge under on_failure='drop'); a prompt whose samples were
    all dropped is NaN in per_prompt and not counted (`_score`)."""
    means = []
    for g in groups:
        kept = [s.reward for s in g.samples if not s.drop_reason]
        means.append(sum(kept) / len(kept) if kept else math.nan)
    return _score(means)


def evaluate(engine, factory: EnvFactory, rows: list[dict], temperature: float,
             samples_per_prompt: int, max_new_tokens: int, stop_ids: tuple[int, ...],
             seed: int, *, tokenizer, limits: EpisodeLimits = EpisodeLimits(),
             group_reward: GroupReward | None = None,
             resources: RunResources | None = None) -> dict[str, Score]:
    """Greedy (1 sample) and sampled (k samples at `temperature`) mean reward over rows, with
    the training run's episode limits and group hook (which sees a group of 1 when greedy).
    `resources`: the run's env resources (envs/resources.py); None: each runner its own."""
    out = {}
    for name, temp, k in (("greedy", 0.0, 1), ("sampled", temperature, samples_per_prompt)):
        groups = collect(engine, factory, rows, temp, k, max_new_tokens, stop_ids, seed,
                         tokenizer=tokenizer, limits=limits, group_reward=group_reward,
                         resources=resources)
        out[name] = group_means(groups)
    return out


def as_dict(scores: dict[str, Score]) -> dict:
    return {k: v.summary() for k, v in scores.items()}
