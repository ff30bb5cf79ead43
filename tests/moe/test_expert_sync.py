"""Weight sync of a mixture of experts' 3-D expert tensors (transformers 5 fuses each layer's
experts into `experts.gate_up_proj` (E, 2I, H) and `experts.down_proj` (E, H, I)): a tiny
Qwen3-MoE, Mixtral and Qwen2-MoE (tests/moe_tiny.py) stepped by AdamW
(tests/realistic_weights.py), bf16 on the wire as an engine gets them.

Covered: every version arrives over the delta codec bit-exact, each delta verified by the
additive hash and (verify_base) the full hash; the additive hash's movement that applying a
delta reports equals the from-scratch sums' difference, and one changed expert element moves
it. Not covered: sharded (FSDP2) expert tensors, expert parallelism.
"""

from __future__ import annotations

import pytest
import torch
from moe_tiny import tiny_moe  # tests/ is on sys.path (tests/conftest.py)
from realistic_weights import rl_states

from traingym.weights import lthash
from traingym.weights.codecs import DeltaCodec, apply_changes
from traingym.weights.hashing import state_hash
from traingym.weights.inproc import InprocConfig, InprocReceiver, InprocSender
from traingym.weights.sync import Publisher, PublisherConfig, Subscriber, SubscriberConfig

VERSIONS = 4


@pytest.fixture(scope="module", params=["qwen3_moe", "mixtral", "qwen2_moe"])
def states(request):
    model, _ = tiny_moe(request.param)
    out = list(rl_states(model.train(), VERSIONS - 1, lr=1e-4, seq=16))
    experts = [k for k in out[0] if ".experts." in k]
    assert experts and all(out[0][k].dim() == 3 for k in experts)
    for a, b in zip(out, out[1:]):  # every step moves the experts, not every element
        moved = [(a[k] != b[k]).float().mean().item() for k in experts]
        assert all(m > 0 for m in moved) and min(moved) < 1, moved
    return request.param, out


def _equal(a, b):
    return set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a)


def test_deltas_deliver_the_expert_tensors_bit_exact_and_verified(states):
    family, versions = states
    name = f"experts-{family}"
    pub = Publisher(InprocSender(InprocConfig(name=name)), PublisherConfig(codec="delta"))
    sub = Subscriber(InprocReceiver(InprocConfig(name=name)), SubscriberConfig(verify_base=True))
    for v, s in enumerate(versions):
        stats = pub.publish(s, v)
        assert stats.codec == ("full" if v == 0 else "delta")
        assert sub.poll(1.0) and sub.version == v
        assert _equal(sub.state, s) and state_hash(sub.state) == state_hash(s)
    assert sub.stats.corrupt == 0 and sub.stats.applied == VERSIONS
    assert stats.payload_bytes < stats.full_bytes


def test_the_additive_hash_moves_with_the_expert_changes(states):
    _, versions = states
    old, new = versions[1], versions[2]
    got, changes = apply_changes({k: v.clone() for k, v in old.items()},
                                 DeltaCodec().encode(old, new), with_sum=True)
    assert _equal(got, new)
    assert (lthash.state_sum(old) + changes.sum == lthash.state_sum(new)).all()
    expert = next(k for k in got if k.endswith("experts.down_proj"))
    got[expert][1, 2, 3] += 1  # one expert element off: the sum no longer matches
    assert not (lthash.state_sum(old) + changes.sum == lthash.state_sum(got)).all()
