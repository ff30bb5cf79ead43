"""ChangeTracking: torch's fused AdamW a chunk at a time, bitwise, and the positions whose bf16
cast changed (trainer/step_changes.py)."""

import numpy as np
import pytest
import torch

from traingym.trainer import step_changes
from traingym.trainer.step_changes import ChangeTracking, trackable


def _model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(300, 700), torch.nn.Linear(700, 5))


def _grads(model, seed):
    g = torch.Generator().manual_seed(seed)
    for p in model.parameters():
        p.grad = torch.randn(p.shape, generator=g) * 1e-2


def _bf16_bits(model):
    return {n: p.detach().to(torch.bfloat16).view(torch.int16).reshape(-1).numpy().copy()
            for n, p in model.named_parameters()}


@pytest.mark.parametrize("chunk", [1 << 10, 1 << 18])
def test_tracked_step_is_bitwise_and_names_every_change(monkeypatch, chunk):
    monkeypatch.setattr(step_changes, "CHUNK", chunk)
    ref, tracked = _model(), _model()
    kw = dict(lr=3e-3, betas=(0.9, 0.99), weight_decay=0.1, fused=True)
    opt_ref = torch.optim.AdamW(ref.parameters(), **kw)
    opt = torch.optim.AdamW(tracked.parameters(), **kw)
    names = {p: [n] for n, p in tracked.named_parameters()}
    tracking = ChangeTracking(opt, names, torch.bfloat16)
    tracking.arm(7)
    start = _bf16_bits(tracked)
    for step in range(3):  # positions accumulate over steps until take()
        _grads(ref, step), _grads(tracked, step)
        opt_ref.step()
        tracking.step()
    for a, b in zip(ref.parameters(), tracked.parameters()):
        assert torch.equal(a, b)
    for (sa, a), (sb, b) in zip(opt_ref.state.items(), opt.state.items()):
        assert all(torch.equal(a[k], b[k]) for k in ("step", "exp_avg", "exp_avg_sq"))
    changed = tracking.take()
    assert changed.base == 7
    end = _bf16_bits(tracked)
    for name in end:
        truly = np.flatnonzero(start[name] != end[name])
        named = changed.positions.get(name, np.zeros(0, np.int64))
        assert np.isin(truly, named).all()  # a superset: none missed
        assert np.all(np.diff(named) > 0)
    assert sum(v.size for v in changed.positions.values()) > 0
    assert tracking.take() is None  # until armed again


def test_one_step_reports_the_values_before_and_after():
    model = _model()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, fused=True)
    tracking = ChangeTracking(opt, {p: [n] for n, p in model.named_parameters()}, torch.bfloat16)
    before = _bf16_bits(model)
    tracking.arm(0)
    _grads(model, 0)
    tracking.step()
    changed, after = tracking.take(), _bf16_bits(model)
    for name, pos in changed.positions.items():
        assert np.array_equal(pos, np.flatnonzero(before[name] != after[name]))
        assert np.array_equal(changed.old[name].view(np.int16), before[name][pos])
        assert np.array_equal(changed.new[name].view(np.int16), after[name][pos])


def test_only_fused_adamw_is_trackable():
    m = _model()
    assert trackable(torch.optim.AdamW(m.parameters(), fused=True))
    assert not trackable(torch.optim.AdamW(m.parameters(), foreach=True))
    assert not trackable(torch.optim.AdamW(m.parameters(), fused=True, amsgrad=True))
    assert not trackable(torch.optim.SGD(m.parameters(), lr=0.1))
    with pytest.raises(ValueError, match="fused AdamW"):
        ChangeTracking(torch.optim.SGD(m.parameters(), lr=0.1), {}, torch.bfloat16)


def test_a_run_reporting_changes_trains_and_syncs_bitwise_as_one_comparing(tmp_path):
    """Three steps of a colocated bf16-engine tiny run, the optimizer reporting its changes or
    not: the same weights bit for bit, the engine verified at every version, and every delta
    read only the reported positions."""
    import traingym
    from traingym.loop.build import build_run
    from traingym.loop.sync import train_loop

    def final(emit: bool):
        cfg = traingym.build_config("tiny", overrides={
            "steps": 3, "model": {"engine_dtype": "bfloat16"}, "checkpoint": {"every": 0},
            "trainer": {"emit_changes": emit}, "eval": {"before": False, "after": False}})
        run, start = build_run(cfg, tmp_path / f"run-{emit}", False, progress=False)
        seen, real = [], run.weights.publish

        def publish(state, version, changed=None):
            seen.append(changed)
            return real(state, version, changed=changed)

        run.weights.publish = publish
        train_loop(run, start)
        engine = {k: v.clone() for k, v in run.weights.subscriber.state.items()}
        weights = {k: v.clone() for k, v in run.trainer.export().items()}
        corrupt = run.weights.subscriber.stats.corrupt
        run.close()
        return weights, engine, seen, corrupt

    a, engine_a, seen_a, _ = final(False)
    b, engine_b, seen_b, corrupt = final(True)
    assert all(c is None for c in seen_a)
    assert len(seen_b) == 3 and all(c is not None and c.base == v for v, c in enumerate(seen_b))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert all(torch.equal(engine_a[k], engine_b[k]) for k in engine_a) and corrupt == 0
    assert all(torch.equal(engine_b[k], b[k].to(torch.bfloat16)) for k in engine_b)
