"""DAPO's dynamic sampling through the shared step body (step.py: fill_batch): groups without
signal are refilled by asking the loop for more, up to algorithm.max_sample_rounds; the batch
is cut to prompts_per_step kept groups; the loops' per-round figures merge."""

import dataclasses

from traingym.algorithms import registry
from traingym.loop.step import fill_batch, merge_info
from traingym.core.types import Group, Sample


def _group(rewards, index):
    return Group([Sample((1,), [2], [0.0], [0], {}, reward=r) for r in rewards], index)


class Source:
    """Hands out groups in order: each pattern entry is one group's rewards."""

    def __init__(self, patterns):
        self.patterns, self.asked, self.next = patterns, [], 0

    def take(self, n):
        self.asked.append(n)
        out = [_group(self.patterns[(self.next + i) % len(self.patterns)], self.next + i)
               for i in range(n)]
        self.next += n
        return out, {"prompt_indices": [g.index for g in out]}


def _algo(name, **knobs):
    cls = registry.get(name)
    return cls(dataclasses.replace(cls.resolve(None, 8), **knobs))


def test_dapo_refills_filtered_groups_up_to_the_batch():
    src = Source([[1, 1], [0, 1], [0, 0], [1, 0], [1, 0], [1, 0]])
    groups, batch, info, rounds = fill_batch(_algo("dapo"), src.take, 4)
    # round 1: 4 groups, 2 without signal -> ask 2 more; round 2: both have signal
    assert src.asked == [4, 2] and rounds == 2
    assert len(batch.groups) == 4 and batch.num_dropped_groups == 2
    assert [g.index for g in batch.groups] == [1, 3, 4, 5]
    assert len(groups) == 6 and info["prompt_indices"] == [0, 1, 2, 3, 4, 5]


def test_refill_stops_after_max_rounds_and_cuts_the_surplus():
    src = Source([[1, 1]])  # never any signal
    _, batch, _, rounds = fill_batch(_algo("dapo", max_sample_rounds=3), src.take, 4)
    assert src.asked == [4, 4, 4] and rounds == 3 and batch.groups == []
    assert batch.num_dropped_groups == 12
    src = Source([[0, 1], [1, 1], [0, 1]])
    _, batch, _, rounds = fill_batch(_algo("dapo"), src.take, 2)
    assert src.asked == [2, 1] and rounds == 2 and len(batch.groups) == 2
    src = Source([[1, 1], [0, 1]])
    _, batch, _, rounds = fill_batch(_algo("grpo"), src.take, 4)  # no dynamic sampling
    assert src.asked == [4] and rounds == 1 and len(batch.groups) == 2


def test_merge_info_joins_rounds():
    a = {"prompt_indices": [1, 2], "async_dropped": 1, "async_staleness_mean": 1.0,
         "async_staleness_max": 1, "async_out": 5}
    b = {"prompt_indices": [3, 4, 5, 6], "async_dropped": 2, "async_staleness_mean": 0.25,
         "async_staleness_max": 2, "async_out": 3}
    m = merge_info(a, b)
    assert m == {"prompt_indices": [1, 2, 3, 4, 5, 6], "async_dropped": 3,
                 "async_staleness_mean": 0.5, "async_staleness_max": 2, "async_out": 3}
