"""Publisher/Subscriber over the in-process transport on real (tiny) RL weight streams:
verification, anchors and budget, late joiners, refusing foreign bases, flipped bytes."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from traingym.weights.base import Payload
from traingym.weights.frame import seal
from weight_sync_builders import WeightSyncConfig, make_publisher, make_subscriber
from traingym.weights.inproc import InprocConfig, InprocReceiver, InprocSender
from realistic_weights import rl_states, tiny_llama
from traingym.weights.sync import (NotServable, Publisher, PublisherConfig, Subscriber,
                                   SubscriberConfig)

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def states():
    return list(rl_states(tiny_llama(), 8, lr=1e-5))


def _equal(a, b):
    return set(a) == set(b) and all(torch.equal(a[k].view(torch.uint8) if a[k].dtype == torch.bool
                                                else a[k], b[k]) for k in a)


def test_every_version_arrives_verified(states):
    cfg = WeightSyncConfig(codec="delta", transport=InprocConfig(name="t1"))
    pub, sub = make_publisher(cfg), make_subscriber(cfg)
    with pytest.raises(NotServable):
        sub.state
    for v, s in enumerate(states):
        stats = pub.publish(s, v)
        assert stats.codec == ("full" if v == 0 else "delta")
        assert sub.poll(1.0) and sub.version == v
        assert _equal(sub.state, s)
    assert stats.payload_bytes < 0.15 * stats.full_bytes
    assert sub.stats.anchors == 1 and sub.stats.corrupt == 0


def test_updates_land_in_the_engines_tensors(states):
    cfg = WeightSyncConfig(codec="delta", transport=InprocConfig(name="t2"))
    engine = {k: torch.zeros_like(v) for k, v in states[0].items()}
    pub, sub = make_publisher(cfg), make_subscriber(cfg, engine)
    for v, s in enumerate(states[:3]):
        pub.publish(s, v)
        sub.poll(1.0)
    assert _equal(engine, states[2])
    assert all(sub.state[k].data_ptr() == engine[k].data_ptr() for k in engine)


def test_anchor_budget_bounds_a_late_joiner(states):
    sender = InprocSender(InprocConfig(name="t3"))
    pub = Publisher(sender, PublisherConfig(codec="delta", anchor_budget=0.25))
    reasons = [pub.publish(s, v).reason for v, s in enumerate(states)]
    assert reasons[0] == "first" and "anchor-budget" in reasons
    late = Subscriber(InprocReceiver(InprocConfig(name="t3")))
    chain = sender.hub.chain.since(None)
    full = sum(t.numel() * t.element_size() for t in states[0].values())
    assert chain[0].is_anchor and sum(p.nbytes for p in chain) <= (1 + 0.25) * full + 1024
    late.wait_for(len(states) - 1, 1.0)
    assert _equal(late.state, states[-1]) and late.stats.anchors == 1


class FlipOnce(InprocReceiver):
    """Delivers the n-th payload with one byte flipped (a copy: the chain stays intact)."""

    def __init__(self, cfg, n):
        super().__init__(cfg)
        self.n, self.count = n, 0

    def receive(self, timeout):
        p = super().receive(timeout)
        self.count += 1
        if self.count != self.n:
            return p
        bufs = [bytearray(b) for b in p.buffers]
        biggest = max(range(len(bufs)), key=lambda i: len(bufs[i]))
        bufs[biggest][len(bufs[biggest]) // 2] ^= 0x40
        return Payload(p.header, [memoryview(b) for b in bufs])


@pytest.mark.parametrize("n", [1, 3])  # the anchor, then a delta
def test_flipped_byte_is_detected_and_resynced(states, n):
    name = f"flip{n}"
    pub = Publisher(InprocSender(InprocConfig(name=name)), PublisherConfig(codec="delta"))
    sub = Subscriber(FlipOnce(InprocConfig(name=name), n))
    for v, s in enumerate(states[:5]):
        pub.publish(s, v)
        while sub.receiver._queue:
            sub.poll(0.05)
        if sub.valid:
            assert _equal(sub.state, states[sub.version])
    assert sub.stats.corrupt == 1 and sub.stats.resyncs >= 1
    assert sub.version == 4 and _equal(sub.state, states[4])


def test_foreign_base_is_refused_until_an_anchor(states):
    name = "foreign"
    pub = Publisher(InprocSender(InprocConfig(name=name)), PublisherConfig(codec="delta"))
    pub.publish(states[0], 0)
    # verify_base: the base is re-hashed before every delta (two passes over the state);
    # by default such a change is caught later (test_lthash.py: the periodic full check)
    sub = Subscriber(InprocReceiver(InprocConfig(name=name)), SubscriberConfig(verify_base=True))
    sub.poll(1.0)
    sub.state["model.norm.weight"][0] += 1  # local corruption behind the subscriber's back
    pub.publish(states[1], 1)
    assert not sub.poll(1.0) and not sub.valid  # re-hash of the base caught it
    sub.wait_for(1, 1.0)  # the resync brought the anchor and the delta
    assert _equal(sub.state, states[1])
    delta = pub.delta.encode(states[1], states[2])
    forged = seal(Payload(dataclasses.replace(delta.header, base_hash="0" * 32,
                                              target_version=2), delta.buffers))
    sub2 = Subscriber(InprocReceiver(InprocConfig(name=name)))
    sub2.wait_for(1, 1.0)
    sub2.receiver._queue.append(forged)
    assert not sub2.poll(1.0) and sub2.stats.refused == 1 and sub2.valid


def test_structure_change_sends_an_anchor(states):
    pub = Publisher(InprocSender(InprocConfig(name="struct")), PublisherConfig(codec="delta"))
    sub = Subscriber(InprocReceiver(InprocConfig(name="struct")))
    pub.publish(states[0], 0)
    bigger = {**states[1], "extra": torch.ones(3, dtype=torch.bfloat16)}
    assert pub.publish(bigger, 1).reason == "structure"
    sub.wait_for(1, 1.0)
    assert _equal(sub.state, bigger)


def test_auto_prefers_delta_on_a_slow_link_and_full_on_a_fast_one(states):
    pub = Publisher(InprocSender(InprocConfig(name="auto")), PublisherConfig(codec="auto"))
    pub.publish(states[0], 0)
    pub.publish(states[1], 1)
    pub._link_s_per_byte = 1e-6  # 1 MB/s
    assert pub.publish(states[2], 2).reason == "delta"
    pub._link_s_per_byte, pub._delta_s, pub._full_s = 1e-15, 1.0, 2.0  # full copies slower
    assert pub.publish(states[3], 3).reason == "delta"
    pub._link_s_per_byte, pub._delta_s, pub._full_s = 1e-15, 1.0, 0.1  # free link, slow encoder
    assert pub.publish(states[4], 4).reason == "auto:full-faster"


class _Capture:
    def __init__(self) -> None:
        self.sent: list[Payload] = []

    def send(self, payload: Payload) -> None:
        self.sent.append(payload)


def test_the_publisher_splits_tensors_only_where_its_link_makes_it_pay():
    """The publisher tells the codec its measured link: on a slow link the tiered split
    (small weights listed on both sides) pays, on a fast one threshold 0 is sent."""
    g = torch.Generator().manual_seed(0)
    tiny = torch.rand(200_000, generator=g) < 0.01
    base = (torch.randn(200_000, generator=g) * torch.where(tiny, 1e-5, 0.02)).bfloat16()
    moved = torch.rand(200_000, generator=g) < torch.where(tiny, 0.3, 0.004)
    step = torch.where(tiny, 3e-5, 2e-4) * torch.randn(200_000, generator=g)
    states = [{"w": base}]
    for _ in range(2):
        states.append({"w": torch.where(moved, (states[-1]["w"].double() + step).bfloat16(),
                                        states[-1]["w"])})
    sender = _Capture()
    pub = Publisher(sender, PublisherConfig(codec="delta"))
    pub.publish(states[0], 0)
    thresholds = []
    for v, link in ((1, 1e-6), (2, 1e-11)):  # 1 MB/s, then 100 GB/s
        pub._link_s_per_byte = link
        pub.publish(states[v], v)
        thresholds.append(sender.sent[-1].header.tensors[0].params[0])
    assert thresholds[0] > 0 and thresholds[1] == 0


def test_dead_sender_raises_on_receive():
    sender = InprocSender(InprocConfig(name="dead"))
    r = InprocReceiver(InprocConfig(name="dead"))
    from traingym.weights.base import PeerDead, TransportTimeout

    with pytest.raises(TransportTimeout):
        r.receive(0.05)
    sender.close()
    with pytest.raises(PeerDead):
        r.receive(5.0)


def test_a_forgotten_chain_makes_anchors_on_demand(states):
    """forget_chain keeps no frames; a receiver that needs an anchor later (a late joiner,
    or one whose state is suspect) gets a fresh one of the newest version from the
    publisher's shadow, and every subscriber then follows the deltas after it."""
    sender = InprocSender(InprocConfig(name="t-forget"))
    pub = Publisher(sender, PublisherConfig(codec="delta", anchor_budget=100.0))
    first = Subscriber(InprocReceiver(InprocConfig(name="t-forget")))
    pub.publish(states[0], 0)
    assert first.poll(1.0)
    sender.forget_chain(pub.reanchor)
    assert sender.hub.chain._frames == []
    assert sender.hub.chain.since(first.hash) == []  # up to date: nothing to send
    pub.publish(states[1], 1)
    assert first.poll(1.0) and first.version == 1 and _equal(first.state, states[1])
    sender.forget_chain(pub.reanchor)
    pub.publish(states[2], 2)  # kept: a receiver at version 1 can still take it
    late = Subscriber(InprocReceiver(InprocConfig(name="t-forget")))
    late._ask()  # holds nothing: resync(None) -> an anchor of version 2, made now
    assert late.poll(1.0) and late.version == 2 and late.stats.anchors == 1
    assert _equal(late.state, states[2])
    assert first.poll(1.0) and first.version == 2  # the delta to 2, not the new anchor
    assert first.hash != late.hash  # the chain was renamed from the fresh anchor on
    pub.publish(states[3], 3)
    assert late.poll(1.0) and late.version == 3 and _equal(late.state, states[3])
    # 3 is based on the renamed 2: refused; it asks, and its hash is no longer on the
    # chain: the fresh anchor of 2 (same version, new name), then 3
    assert not first.poll(1.0) and first.stats.refused == 1
    first.wait_for(3, 2.0)
    assert first.stats.anchors == 2
    assert first.hash == late.hash and _equal(first.state, states[3])


def test_a_step_that_changes_nothing_still_reaches_a_receiver_that_asks(states):
    """Versions 1 and 2 are equal (no weight moved in the engine's dtype), so both deltas
    have one name; a receiver at version 1 that asks for what follows its hash (as after a
    lost link) still gets version 2 and then 3."""
    sender = InprocSender(InprocConfig(name="t-same"))
    pub = Publisher(sender, PublisherConfig(codec="delta", anchor_budget=100.0))
    at1 = Subscriber(InprocReceiver(InprocConfig(name="t-same")))
    pub.publish(states[0], 0)
    pub.publish(states[1], 1)
    at1.wait_for(1, 2.0)
    h1 = pub.hash
    pub.publish(states[1], 2)
    assert pub.hash == h1 == at1.hash
    pub.publish(states[2], 3)
    chain = sender.hub.chain
    assert [p.header.target_version for p in chain.since(h1)] == [2, 3]
    at1.receiver.resync(at1.hash)  # what it holds, as a reconnecting receiver says
    at1.wait_for(3, 2.0)
    assert at1.version == 3 and _equal(at1.state, states[2])
    sender.forget_chain(pub.reanchor)  # a forgotten chain: its head is what receivers hold
    assert chain.since(pub.hash) == []
    pub.publish(states[2], 4)  # again no change: the delta from that hash is sent
    assert [p.header.target_version for p in chain.since(pub.hash)] == [4]
