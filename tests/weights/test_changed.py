"""A delta that reads only the positions the optimizer step reported (weights/base.py Changed,
Publisher.publish's `changed`): the same payload as the comparison pass, ignored when its base
is not the last published version, and a missed change caught by the next full hash."""

import numpy as np
import torch

from traingym.weights.base import Changed
from traingym.weights.hashing import bits
from traingym.weights.inproc import InprocConfig, InprocReceiver, InprocSender
from traingym.weights.sync import Publisher, PublisherConfig, Subscriber

torch.set_num_threads(1)


def _masters(steps=4, seed=0):
    """fp32 states of a few small AdamW-like steps (about 1-5% of bf16 values change)."""
    g = torch.Generator().manual_seed(seed)
    state = {"a": torch.randn(4000, generator=g) * 0.02, "b": torch.randn(30, 70, generator=g),
             "c": torch.ones(50)}
    out = [state]
    for _ in range(steps):
        state = {k: v + torch.randn(v.shape, generator=g) * 1e-4 * (k != "c")
                 for k, v in state.items()}
        out.append(state)
    return out


def _positions(old, new):
    return {k: np.flatnonzero(bits(old[k].to(torch.bfloat16)) != bits(new[k].to(torch.bfloat16)))
            for k in old}


def _pair(name, every=16):
    pub = Publisher(InprocSender(InprocConfig(name=name)),
                    PublisherConfig(codec="delta", full_hash_every=every))
    return pub, Subscriber(InprocReceiver(InprocConfig(name=name)))


def _cast(state):
    return {k: v.to(torch.bfloat16) for k, v in state.items()}


def test_reported_positions_give_the_comparisons_payload():
    states = _masters()
    hinted, h_sub = _pair("changed-1", every=2)
    plain, p_sub = _pair("changed-2", every=2)
    for v, s in enumerate(states):
        changed = None if v == 0 else Changed(v - 1, _positions(states[v - 1], s))
        a = hinted.publish(s, v, cast=torch.bfloat16, changed=changed)
        b = plain.publish(s, v, cast=torch.bfloat16)
        assert (a.codec, a.payload_bytes, a.changed) == (b.codec, b.payload_bytes, b.changed)
        assert h_sub.poll(1.0) and h_sub.version == v and hinted.hash == plain.hash
        assert all(torch.equal(h_sub.state[k], t) for k, t in _cast(s).items())
    assert h_sub.stats.corrupt == 0 and a.changed > 0


def test_a_superset_is_filtered_and_a_stale_base_is_ignored():
    states = _masters(2)
    pub, sub = _pair("changed-3")
    pub.publish(states[0], 0, cast=torch.bfloat16)
    every = {k: np.arange(v.numel()) for k, v in states[0].items()}  # all: a superset
    stats = pub.publish(states[1], 1, cast=torch.bfloat16, changed=Changed(0, every))
    assert stats.changed == sum(p.size for p in _positions(states[0], states[1]).values())
    nothing = Changed(0, {})  # base 0 is not the last version (1): ignored, so compared
    stats = pub.publish(states[2], 2, cast=torch.bfloat16, changed=nothing)
    assert stats.changed == sum(p.size for p in _positions(states[1], states[2]).values()) > 0
    sub.wait_for(2, 5.0)
    assert all(torch.equal(sub.state[k], t) for k, t in _cast(states[2]).items())


def test_a_missed_change_fails_the_next_full_hash():
    states = _masters(2)
    pub, sub = _pair("changed-4", every=2)
    pub.publish(states[0], 0, cast=torch.bfloat16)
    assert sub.poll(1.0)
    for v in (1, 2):  # the report leaves out tensor "a": its changes never reach the engine
        pos = _positions(states[v - 1], states[v])
        pub.publish(states[v], v, cast=torch.bfloat16, changed=Changed(v - 1, {"b": pos["b"]}))
        sub.poll(0.2)
    assert sub.version == 1  # the second delta's full hash is of the true state: refused
    assert sub.stats.corrupt == 1


def _values(old, new, positions):
    return ({k: bits(old[k].to(torch.bfloat16))[p] for k, p in positions.items()},
            {k: bits(new[k].to(torch.bfloat16))[p] for k, p in positions.items()})


def test_reported_values_are_used_and_a_wrong_old_value_fails_that_delta():
    states = _masters(2)
    pub, sub = _pair("changed-5")
    pub.publish(states[0], 0, cast=torch.bfloat16)
    pos = _positions(states[0], states[1])
    old, new = _values(states[0], states[1], pos)
    pub.publish(states[1], 1, cast=torch.bfloat16, changed=Changed(0, pos, old, new))
    sub.wait_for(1, 5.0)
    assert all(torch.equal(sub.state[k], t) for k, t in _cast(states[1]).items())
    pos = _positions(states[1], states[2])
    old, new = _values(states[1], states[2], pos)
    old["a"] = old["a"] ^ np.uint16(1)  # not what the engine holds there
    pub.publish(states[2], 2, cast=torch.bfloat16, changed=Changed(1, pos, old, new))
    assert not sub.poll(0.5) and sub.version == 1 and sub.stats.corrupt == 1
