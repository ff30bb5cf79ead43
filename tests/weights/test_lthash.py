"""The incremental (additive) hash and the sync's O(changes) verification: the incremental
update equals recomputation from scratch (on both ends, any sharding); a flipped bit anywhere
in a state changes its hash; a changed value the delta does not carry, or one it carries
wrongly, is caught and resynced; a weight changed behind a subscriber's back is caught where
a delta writes it, or at the periodic full check; sharding costs < 2% in bytes."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from traingym.weights import extract, lthash
from traingym.weights.base import TransportTimeout
from traingym.weights.changes import plan_pieces
from traingym.weights.codecs import DeltaCodec, apply_changes
from traingym.weights.frame import from_buffer, seal, to_bytes
from traingym.weights.hashing import bits, state_hash
from traingym.weights.inproc import InprocConfig, InprocReceiver, InprocSender
from realistic_weights import rl_states, tiny_llama
from traingym.weights.sync import Publisher, PublisherConfig, Subscriber

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def states():
    return list(rl_states(tiny_llama(), 5, lr=1e-5))


def _clone(s):
    return {k: v.clone() for k, v in s.items()}


def _equal(a, b):
    return set(a) == set(b) and all(np.array_equal(bits(a[k]), bits(b[k])) for k in a)


@pytest.mark.parametrize("threads", [1, 3])
def test_incremental_sum_equals_recomputation(states, threads):
    codec = DeltaCodec(threads=threads)
    for old, new in zip(states, states[1:]):
        payload, sent = codec.encode_changes(old, new)
        assert sent.n_changed > 0
        want = lthash.state_sum(new) - lthash.state_sum(old)
        assert np.array_equal(sent.sum, want)  # the sender's, from the changes it extracted
        wire = from_buffer(to_bytes(seal(payload)))
        got, applied = apply_changes(_clone(old), wire, threads=threads)
        assert np.array_equal(applied.sum, want)  # the receiver's, from the writes it made
        assert _equal(got, new)


def test_sum_does_not_depend_on_order_or_batching():
    rng = np.random.default_rng(0)
    pos = rng.permutation(100_000)[:30_000]
    v = rng.integers(0, 2**16, pos.size).astype(np.uint16)
    whole = lthash.element_sum("w", 100_000, pos, v)
    parts = sum((lthash.element_sum("w", 100_000, pos[i::7], v[i::7]) for i in range(7)),
                lthash.zero())
    assert np.array_equal(whole, parts)
    assert not np.array_equal(whole, lthash.element_sum("v", 100_000, pos, v))  # name keyed


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float64, torch.int64])
def test_a_flipped_bit_anywhere_changes_the_hash(states, dtype):
    scale = 1.0 if dtype.is_floating_point else 1e4  # integers: not all zero
    state = {k: (v.float() * scale).to(dtype) for k, v in states[2].items()}
    base = lthash.state_sum(state)
    rng = np.random.default_rng(1)
    flips = 0
    for name, t in state.items():
        b = bits(t)
        width = 8 * b.itemsize
        for p in {0, b.size - 1, *rng.integers(0, b.size, 3).tolist()}:
            for bit in (0, width - 1, int(rng.integers(width))):
                flipped = _clone(state)
                bits(flipped[name])[p] ^= b.dtype.type(1) << b.dtype.type(bit)
                assert not np.array_equal(lthash.state_sum(flipped), base), (name, p, bit)
                flips += 1
    assert flips > 100
    # two elements swapped, a value moved one place: also different
    moved = _clone(state)
    w = bits(moved["model.layers.0.mlp.up_proj.weight"])
    i = int(np.flatnonzero(w[:-1] != w[1:])[0])
    w[[i, i + 1]] = w[[i + 1, i]]
    assert not np.array_equal(lthash.state_sum(moved), base)


class _Dropping(DeltaCodec):
    """A codec bug: the payload misses one changed value (or carries a wrong one), while the
    changes the publisher hashes are the true ones."""

    mode = "drop"

    def encode_changes(self, old, new, with_sum=True, cast=None, link_s_per_byte=None,
                       changed=None):
        payload, changes = super().encode_changes(old, new, with_sum, cast, link_s_per_byte)
        name, start, pos, _ = changes.pieces[0]
        wrong = _clone(new)
        b = bits(wrong[name])
        if self.mode == "drop":
            b[start + pos[0]] = bits(old[name])[start + pos[0]]  # revert one change
        else:
            q = (start + pos[-1] + 1) % b.size  # an extra change the state does not have
            b[q] ^= b.dtype.type(1)
        return super().encode_changes(old, wrong, with_sum, cast, link_s_per_byte)[0], changes


@pytest.mark.parametrize("mode", ["drop", "extra"])
def test_a_changed_value_the_delta_does_not_carry_is_caught(states, mode):
    """The bad delta is on the sender's chain: the subscriber refuses it (and every delta
    after it) on each replay, serving nothing wrong, until an anchor comes."""
    name = f"lt-{mode}"
    pub = Publisher(InprocSender(InprocConfig(name=name)), PublisherConfig(codec="delta"))
    sub = Subscriber(InprocReceiver(InprocConfig(name=name)))
    pub.publish(states[0], 0)
    sub.wait_for(0, 1.0)
    good, pub.delta = pub.delta, _Dropping()
    pub.delta.mode = mode
    pub.publish(states[1], 1)
    pub.delta = good
    assert not sub.poll(1.0) and not sub.valid and sub.stats.corrupt == 1
    pub.publish(states[2], 2)
    for _ in range(4):
        try:
            sub.poll(0.05)
        except TransportTimeout:
            pass
        assert not sub.valid or sub.version == 0  # never v1 or v2 built on the bad delta
    pub.cfg = PublisherConfig(codec="full")
    pub.publish(states[3], 3)
    sub.wait_for(3, 5.0)
    assert _equal(sub.state, states[3]) and sub.stats.anchors >= 2


def test_a_flipped_weight_that_the_next_delta_writes_is_caught_there(states):
    pub = Publisher(InprocSender(InprocConfig(name="lt-touch")), PublisherConfig(codec="delta"))
    sub = Subscriber(InprocReceiver(InprocConfig(name="lt-touch")))
    pub.publish(states[0], 0)
    sub.wait_for(0, 1.0)
    _, changes = DeltaCodec().encode_changes(states[0], states[1])
    name, start, pos, _ = changes.pieces[len(changes.pieces) // 2]
    bits(sub.state[name])[start + pos[0]] ^= np.uint16(1 << 3)  # behind its back
    pub.publish(states[1], 1)
    assert not sub.poll(1.0) and sub.stats.corrupt == 1
    sub.wait_for(1, 2.0)  # resync: the anchor and the delta again
    assert _equal(sub.state, states[1])


def test_a_flipped_weight_no_delta_writes_is_caught_by_the_full_check(states):
    cfg = PublisherConfig(codec="delta", full_hash_every=2)
    pub = Publisher(InprocSender(InprocConfig(name="lt-full")), cfg)
    sub = Subscriber(InprocReceiver(InprocConfig(name="lt-full")))
    pub.publish(states[0], 0)
    sub.wait_for(0, 1.0)
    touched = set()
    for old, new in zip(states[:3], states[1:3]):
        for name, start, pos, _ in DeltaCodec().encode_changes(old, new)[1].pieces:
            touched |= {(name, int(start + p)) for p in pos}
    name = "model.norm.weight"
    p = next(i for i in range(sub.state[name].numel()) if (name, i) not in touched)
    bits(sub.state[name])[p] ^= np.uint16(1 << 14)
    pub.publish(states[1], 1)
    assert sub.poll(1.0) and sub.version == 1  # incremental: the flip is not in this delta
    pub.publish(states[2], 2)  # the 2nd delta carries the full hash
    assert not sub.poll(1.0) and sub.stats.corrupt == 1
    sub.wait_for(2, 2.0)
    assert _equal(sub.state, states[2])


def test_sharding_costs_under_2_percent_and_applies_in_parallel(states):
    model = tiny_llama(hidden=128, layers=2, vocab=2048)
    old, new = list(rl_states(model, 2, lr=1e-5))[1:]
    one = seal(DeltaCodec(threads=1).encode(old, new))
    eight = seal(DeltaCodec(threads=8).encode(old, new))
    assert sum(1 for e in eight.header.tensors if e.span) >= 4  # tensors were cut
    assert len(to_bytes(eight)) < 1.02 * len(to_bytes(one))
    got, _ = apply_changes(_clone(old), from_buffer(to_bytes(eight)), threads=4)
    assert _equal(got, new)


def test_pieces_cover_every_tensor_once(monkeypatch):
    monkeypatch.setattr("traingym.weights.changes.PIECE_ALIGN", 16)
    g = torch.Generator().manual_seed(0)
    state = {f"t{i}": torch.randn(int(n), generator=g).bfloat16()
             for i, n in enumerate([1000, 0, 3, 5000, 17, 4096])}
    for shards in (1, 2, 3, 7, 40):
        runs = plan_pieces(state, shards)
        assert 1 <= len(runs) <= shards
        seen = {}
        for name, start, stop in (p for run in runs for p in run):
            assert 0 <= start <= stop <= state[name].numel()
            seen.setdefault(name, []).append((start, stop))
        for name, t in state.items():
            spans = sorted(seen[name])
            assert spans[0][0] == 0 and spans[-1][1] == t.numel()
            assert all(a[1] == b[0] for a, b in zip(spans, spans[1:]))


def test_sync_hash_names_the_state_and_full_hash_matches(states):
    pub = Publisher(InprocSender(InprocConfig(name="lt-name")),
                    PublisherConfig(codec="delta", full_hash_every=3))
    sub = Subscriber(InprocReceiver(InprocConfig(name="lt-name")))
    for v, s in enumerate(states):
        pub.publish(s, v)
        sub.wait_for(v, 1.0)
        assert sub.hash == pub.hash and _equal(sub.state, s)
    assert pub.full_hash() == state_hash(states[-1])


def _masters(n_steps=3, seed=0):
    """fp32 master states whose bf16 casts change sparsely, and one dense step."""
    g = torch.Generator().manual_seed(seed)
    w = {"a": torch.randn(300_000, generator=g) * 0.02, "b": torch.randn(70, 9, generator=g),
         "c": torch.randn(5000, generator=g)}
    out = [{k: v.clone() for k, v in w.items()}]
    for i in range(n_steps):
        for k, v in w.items():
            v += 1e-5 * torch.randn(v.shape, generator=g)
        if i == n_steps - 1:
            w["c"] += torch.randn(5000, generator=g)  # dense: xor or raw
        out.append({k: v.clone() for k, v in w.items()})
    return out


@pytest.mark.parametrize("threads", [1, 3])
def test_cast_path_matches_casting_first(threads, monkeypatch):
    monkeypatch.setattr(extract, "CAST_CHUNK", 4096)  # many chunks, a ragged last one
    monkeypatch.setattr("traingym.weights.changes.PIECE_ALIGN", 1024)
    masters = _masters()
    cfg = PublisherConfig(codec="delta", full_hash_every=2, threads=threads)
    fused = Publisher(InprocSender(InprocConfig(name=f"cast-f{threads}")), cfg)
    plain = Publisher(InprocSender(InprocConfig(name=f"cast-p{threads}")), cfg)
    sub = Subscriber(InprocReceiver(InprocConfig(name=f"cast-f{threads}")))
    for v, m in enumerate(masters):
        wire = {k: t.to(torch.bfloat16) for k, t in m.items()}
        a, b = fused.publish(m, v, cast=torch.bfloat16), plain.publish(wire, v)
        assert (a.codec, a.payload_bytes, a.changed) == (b.codec, b.payload_bytes, b.changed)
        assert fused.hash == plain.hash
        sub.wait_for(v, 1.0)
        assert _equal(sub.state, wire)
    methods = {e.method for e in fused.sender.hub.chain.since(None)[-1].header.tensors}
    assert methods & {"xor", "raw"} and methods & {"tiered", "sparse"}


def test_cast_to_the_same_dtype_does_not_alias_the_trainer():
    masters = _masters(1)
    live = {k: v.clone() for k, v in masters[0].items()}
    pub = Publisher(InprocSender(InprocConfig(name="cast-same")), PublisherConfig(codec="delta"))
    sub = Subscriber(InprocReceiver(InprocConfig(name="cast-same")))
    pub.publish(live, 0, cast=torch.float32)
    for k, v in live.items():
        v.copy_(masters[1][k])  # the optimizer steps in place
    pub.publish(live, 1, cast=torch.float32)
    sub.wait_for(1, 1.0)
    assert _equal(sub.state, masters[1]) and pub.full_hash() == state_hash(masters[1])


def test_full_sends_with_cast_reuse_the_shadow_and_stay_exact():
    """An anchor cast from the masters is cast into the shadow's own tensors (no new copy of
    the model per full send); deltas after it, and full sends between deltas, stay exact."""
    masters = _masters()
    pub = Publisher(InprocSender(InprocConfig(name="cast-full")), PublisherConfig(codec="full"))
    sub = Subscriber(InprocReceiver(InprocConfig(name="cast-full")))
    pub.publish(masters[0], 0, cast=torch.bfloat16)
    held = {k: t.data_ptr() for k, t in pub._shadow.items()}
    for v, m in enumerate(masters[1:], start=1):
        pub.cfg = PublisherConfig(codec="full" if v % 2 else "delta")
        stats = pub.publish(m, v, cast=torch.bfloat16)
        assert stats.codec == pub.cfg.codec
        assert {k: t.data_ptr() for k, t in pub._shadow.items()} == held
        sub.wait_for(v, 1.0)
        wire = {k: t.to(torch.bfloat16) for k, t in m.items()}
        assert _equal(sub.state, wire) and pub.full_hash() == state_hash(wire)
