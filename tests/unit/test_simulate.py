"""The pipeline simulator against cases with known answers: sync step = generation + slowest
env + train + publish; async without env latency keeps the trainer busy at the staleness
bound; staleness 0 does not overlap; a slow link makes engines lag and drop; seeded."""

import pytest

from traingym.cluster.simulate import SimConfig, simulate

QUIET = dict(env_median_s=1e-9, env_sigma=0.0, gen_fixed_s=0.01, gen_row_s=0.001,
             train_s=0.2, publish_s=0.01, steps=20)


def test_sync_step_is_the_sum_of_its_phases():
    r = simulate(SimConfig(mode="sync", **QUIET))
    gen = 0.01 + 0.001 * 32
    assert r.seconds_per_step == pytest.approx(gen + 0.2 + 0.01, rel=1e-6)
    assert r.trainer_idle_frac == pytest.approx(gen / (gen + 0.21), rel=1e-6)


@pytest.mark.parametrize("k", [1, 2])
def test_async_without_env_latency_keeps_the_trainer_busy(k):
    r = simulate(SimConfig(mode="async", max_staleness=k, **QUIET))
    assert r.trainer_idle_frac == pytest.approx(0.0, abs=1e-9)
    assert r.samples_per_s == pytest.approx(32 / 0.21, rel=1e-6)
    assert r.dropped == 0
    assert 0 < r.staleness_mean <= k


def test_staleness_zero_does_not_overlap():
    r = simulate(SimConfig(mode="async", max_staleness=0, **QUIET))
    gen = 0.01 + 0.001 * 32
    assert r.seconds_per_step == pytest.approx(gen + 0.21, rel=1e-6)
    assert r.dropped == 0 and r.staleness_mean == 0


def test_slow_link_makes_engines_lag_and_drop():
    fast = simulate(SimConfig(mode="async", max_staleness=0, **QUIET))
    slow = simulate(SimConfig(mode="async", max_staleness=0, link_latency_s=0.05, **QUIET))
    assert slow.dropped > 0 and slow.seconds_per_step > fast.seconds_per_step


def test_heavy_tail_hurts_sync_more_and_runs_are_seeded():
    tail = dict(QUIET, env_median_s=0.05, env_sigma=1.0)
    sync = simulate(SimConfig(mode="sync", **tail))
    a2 = simulate(SimConfig(mode="async", max_staleness=2, **tail))
    assert sync.trainer_idle_frac > 0.4 and a2.trainer_idle_frac < sync.trainer_idle_frac / 2
    assert simulate(SimConfig(mode="async", seed=3, **tail)) == simulate(
        SimConfig(mode="async", seed=3, **tail))
    assert simulate(SimConfig(mode="async", seed=3, **tail)) != simulate(
        SimConfig(mode="async", seed=4, **tail))
