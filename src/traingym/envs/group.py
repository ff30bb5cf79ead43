"""The group scoring hook: one function over the G samples of a group that sets their rewards.

`def group_reward(samples: list[Sample]) -> list[float]` sees every sample with the reward its
env gave it and returns the G rewards to train on, in order (for rewards that compare samples:
ranking, pairwise preference, a bonus for the shortest correct answer). It runs after every
episode of the group has ended. If it raises or returns anything but G finite floats, the run
stops with a RewardError naming the group. Samples marked dropped (Sample.drop_reason: their
reward is unknown) are not shown to it: it sees the others (G is their count) and the dropped
ones keep their placeholder; a group with none left is not scored.
"""

from __future__ import annotations

import math
from typing import Callable

from traingym.core.types import Sample
from traingym.envs.single_turn import RewardError

GroupReward = Callable[[list[Sample]], list[float]]


def score_group(fn: GroupReward, samples: list[Sample]) -> list[float]:
    """The group's rewards: `fn` over its samples not dropped, the dropped ones unchanged."""
    kept = [i for i, s in enumerate(samples) if s.drop_reason is None]
    out = [s.reward for s in samples]
    if kept:
        for i, value in zip(kept, _score_kept(fn, [samples[i] for i in kept])):
            out[i] = value
    return out


def _score_kept(fn: GroupReward, samples: list[Sample]) -> list[float]:
    name = getattr(fn, "__name__", fn)
    where = (f"\n  group of {len(samples)} samples, example: {samples[0].example!r}\n  rewards "
             f"from the env: {[s.reward for s in samples]}")
    try:
        values = fn(samples)
    except Exception as e:  # re-raised with the group attached, never swallowed
        raise RewardError(f"group reward {name!s} raised {type(e).__name__}: {e}{where}",
                          samples[0]) from e
    ok = (isinstance(values, (list, tuple)) and len(values) == len(samples)
          and all(not isinstance(v, bool) and isinstance(v, (int, float)) and math.isfinite(v)
                  for v in values))
    if not ok:
        raise RewardError(f"group reward {name!s} returned {values!r}; it must return a list of "
                          f"{len(samples)} finite floats, one per sample{where}", samples[0])
    return [float(v) for v in values]
