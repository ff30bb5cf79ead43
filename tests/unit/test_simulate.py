"""The pipeline simulator against cases with known answers: sync step = generation + slowest
env + train + publish; async without env latency keeps the trainer busy at the staleness
bound; staleness 0 does not overlap; a slow link makes engines lag and drop; seeded.
Scale extensions: the defaults reproduce the earlier results bit for bit; env pool, decode
rates, data-parallel trainer and weight fan-out against closed forms; size_cluster against
an exhaustive search."""

import hashlib
import math
from dataclasses import replace

import pytest

from traingym.plan.simulate import (
    SimConfig,
    allreduce_seconds,
    decode_seconds,
    link_seconds,
    simulate,
    size_cluster,
    train_seconds,
)

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


# --- the scale extensions: env pool, data-parallel trainer, decode rates, weight fan-out ---
# Results of the simulator before the pool, trainer ranks and rates were added (commit
# db26c0c), full float reprs: with the defaults they must not move by one bit.
BEFORE = [
    ({}, 76.0573841706853, 0.38203375361318254, 17, 0.8170731707317073, "bf462bc2dcd0dad3"),
    ({"mode": "sync"}, 35.762490517903665, 0.7094297645420325, 0, 0.0, "6f6f5035dab353be"),
    ({"mode": "async", "max_staleness": 2}, 122.63340988477985, 0.003603544686164429, 33,
     1.4637096774193548, "b8789566590e5774"),
    ({"mode": "async", "max_staleness": 0, "link_latency_s": 0.05}, 24.880863092211396,
     0.7978429873757821, 232, 0.0, "b26aa7b7b4da696c"),
    ({"mode": "async", "max_staleness": 4, "prompts_per_step": 6, "group_size": 3,
      "env_sigma": 1.5, "seed": 7}, 69.23076923076928, 0.0, 26, 2.7311827956989245,
     "03f16d7566507dc4"),
    ({"mode": "async", "max_staleness": 1, "engines": 3, "weight_bytes": 2e7,
      "link_bytes_per_s": 1e8, "window": 12}, 63.444999350433996, 0.4845093802777242, 210,
     0.9666666666666667, "b22b1e0fd2637e1c"),
    ({"mode": "async", "max_staleness": 2, "engines": 2, "env_median_s": 0.3, "train_s": 0.1,
      "seed": 5}, 58.43750392925584, 0.7991210802431833, 46, 1.0206611570247934,
     "d48abdf10522dddb"),
    ({"mode": "sync", "env_median_s": 0.2, "env_sigma": 0.5, "prompts_per_step": 5,
      "seed": 11}, 21.5976191468613, 0.7192309510908029, 0, 0.0, "c952b1b3aaa3f0b7"),
]


def _key(r):
    return (r.samples_per_s, r.trainer_idle_frac, r.dropped, r.staleness_mean,
            hashlib.sha256(repr(r.step_seconds).encode()).hexdigest()[:16])


@pytest.mark.parametrize("case", BEFORE, ids=lambda c: repr(c[0]))
def test_defaults_reproduce_the_earlier_results_bit_for_bit(case):
    assert _key(simulate(SimConfig(**case[0]))) == case[1:]


@pytest.mark.parametrize("case", BEFORE, ids=lambda c: repr(c[0]))
def test_a_pool_larger_than_any_burst_is_the_unlimited_pool(case):
    big = simulate(SimConfig(env_workers=10_000, **case[0]))
    assert _key(big) == case[1:] and big.env_wait_s == 0.0 and 0 < big.env_util < 0.01


def test_sync_env_pool_closed_form():
    """Deterministic env steps (sigma 0) of d seconds, rows arriving together in c slots:
    the slowest ends after ceil(rows / c) x d; the pool is busy rows x d of c x step."""
    d, c, rows = 0.5, 5, 32
    cfg = SimConfig(mode="sync", env_median_s=d, env_sigma=0.0, env_workers=c,
                    **{k: v for k, v in QUIET.items() if not k.startswith("env")})
    r = simulate(cfg)
    gen = 0.01 + 0.001 * rows
    step = gen + math.ceil(rows / c) * d + 0.21
    assert r.seconds_per_step == pytest.approx(step, rel=1e-9)
    assert r.env_util == pytest.approx(rows * d / (c * step), rel=1e-9)
    assert r.engine_util == pytest.approx(gen / step, rel=1e-9)
    waits = [(i // c) * d for i in range(rows)]  # the i-th step waits for floor(i / c) waves
    assert r.env_wait_s == pytest.approx(sum(waits) / rows, rel=1e-9)


def test_an_env_timeout_caps_the_slowest_sample():
    tail = dict(QUIET, env_median_s=0.1, env_sigma=2.0)
    free, capped = (simulate(SimConfig(mode="sync", env_timeout_s=t, **tail)) for t in (0, 0.3))
    gen = 0.01 + 0.001 * 32
    assert max(free.step_seconds) > gen + 0.3 + 0.21  # sigma 2: some step's slowest is > 0.3 s
    assert max(capped.step_seconds) == pytest.approx(gen + 0.3 + 0.21, rel=1e-9)


def test_more_env_workers_never_lower_throughput():
    tail = dict(QUIET, env_median_s=0.1, env_sigma=1.0, steps=30, train_s=0.1)
    sync = [simulate(SimConfig(mode="sync", env_workers=w, **tail)).seconds_per_step
            for w in range(1, 40)]
    assert all(b <= a for a, b in zip(sync, sync[1:]))  # sync: exactly, step by step
    for seed in range(3):  # async: doubling, exactly; one more worker, up to seeded noise
        for k in (1, 2):
            base = dict(tail, mode="async", max_staleness=k, engines=2, seed=seed)
            xs = [simulate(SimConfig(env_workers=w, **base)).samples_per_s
                  for w in (1, 2, 4, 8, 16, 32, 0)]
            assert all(b >= a for a, b in zip(xs, xs[1:])), (seed, k, xs)


def test_decode_rate_is_throughput_bound_at_large_batch_latency_bound_at_small():
    cfg = SimConfig(completion_tokens=1000, engine_tokens_per_s=8000.0, seq_tokens_per_s=100.0)
    assert decode_seconds(cfg, 1) == pytest.approx(10.0)  # 1000 tokens at 100/s
    assert decode_seconds(cfg, 80) == pytest.approx(10.0)  # the knee: 80 x 100 = 8000
    assert decode_seconds(cfg, 800) == pytest.approx(100.0)  # 800k tokens at 8000/s
    assert decode_seconds(SimConfig(), 800) == 0.0


def test_one_engine_without_env_latency_runs_at_the_analytic_rate():
    rates = dict(gen_fixed_s=0.0, gen_row_s=0.0, env_median_s=1e-9, env_sigma=0.0,
                 completion_tokens=100, engine_tokens_per_s=4000.0, steps=20)
    # sync: each step = decode of all 32 rows + train + publish
    r = simulate(SimConfig(mode="sync", train_s=0.2, publish_s=0.01, **rates))
    assert r.seconds_per_step == pytest.approx(32 * 100 / 4000 + 0.21, rel=1e-6)
    # async, engine-bound (a near-free trainer): samples/s = the engine's rows per second
    r = simulate(SimConfig(mode="async", max_staleness=1, train_s=1e-6, publish_s=0.0,
                           **rates))
    assert r.samples_per_s == pytest.approx(4000 / 100, rel=1e-3)
    assert r.engine_util == pytest.approx(1.0, rel=1e-3) and r.trainer_idle_frac > 0.99


def test_data_parallel_train_time_and_all_reduce_term():
    cfg = SimConfig(prompts_per_step=64, group_size=16, train_s=0.5, trainer_gpus=8,
                    train_tokens_per_sample=1500, train_tokens_per_s_per_gpu=5000.0,
                    grad_bytes=14e9, allreduce_bytes_per_s=40e9)
    assert allreduce_seconds(cfg) == pytest.approx(2 * 7 / 8 * 14e9 / 40e9)
    assert train_seconds(cfg) == pytest.approx(0.5 + 64 * 16 * 1500 / (5000 * 8) + 0.6125)
    nodes = replace(cfg, trainer_gpus=16, node_gpus=8, internode_bytes_per_s=1e10)
    assert allreduce_seconds(nodes) == pytest.approx(2 * 15 / 16 * 14e9 / 1e10)
    assert allreduce_seconds(replace(nodes, trainer_gpus=8)) == allreduce_seconds(cfg)
    one = SimConfig(grad_bytes=14e9, trainer_gpus=1)
    assert allreduce_seconds(one) == 0.0 and train_seconds(one) == one.train_s
    quiet = {k: v for k, v in QUIET.items() if k != "train_s"}
    r = simulate(SimConfig(mode="sync", train_s=0.0, trainer_gpus=4, grad_bytes=1e9,
                           allreduce_bytes_per_s=1e10, **quiet))
    assert r.seconds_per_step == pytest.approx(0.01 + 0.032 + 2 * 3 / 4 * 0.1 + 0.01, rel=1e-6)


def test_weight_fan_out_formulas():
    base = dict(weight_bytes=1e9, link_bytes_per_s=1e10, link_latency_s=0.01)
    for engines, depth in [(1, 1), (2, 2), (3, 2), (4, 3), (7, 3), (8, 4), (448, 9)]:
        tree = SimConfig(engines=engines, fanout="broadcast", **base)
        assert link_seconds(tree) == pytest.approx(0.01 * depth + 0.1)
        assert depth == math.ceil(math.log2(engines + 1))
        sender = SimConfig(engines=engines, fanout="sender", **base)
        assert link_seconds(sender) == pytest.approx(0.01 + engines * 0.1)
    with pytest.raises(ValueError):
        simulate(SimConfig(fanout="carrier pigeon"))


def test_a_blocking_publish_waits_for_the_link_and_fresh_weights_then_arrive_at_once():
    quiet = dict(QUIET, engines=4, weight_bytes=1e8, link_bytes_per_s=1e9, fanout="sender")
    r = simulate(SimConfig(mode="async", max_staleness=1, publish_waits_for_link=True, **quiet))
    assert r.seconds_per_step == pytest.approx(0.2 + 0.01 + 4 * 0.1, rel=1e-6)  # trainer-bound
    assert r.dropped == 0 and r.trainer_idle_frac == pytest.approx(0.0, abs=1e-9)
    lag = simulate(SimConfig(mode="async", max_staleness=0, **quiet))  # the weights come late
    assert lag.dropped > 0
    sync = simulate(SimConfig(mode="sync", **quiet))  # sync waits for the link every step
    assert sync.seconds_per_step == pytest.approx(0.01 + 0.001 * 8 + 0.21 + 0.4, rel=1e-6)


def test_applying_weights_pauses_the_engine():
    quiet = dict(QUIET, max_staleness=2, mode="async", train_s=0.01, publish_s=0.0)
    free, paid = (simulate(SimConfig(apply_s=a, **quiet)) for a in (0.0, 0.05))
    assert paid.engine_util < free.engine_util and paid.samples_per_s < free.samples_per_s


def test_engines_that_never_catch_up_stop_the_run_as_stalled():
    r = simulate(SimConfig(mode="async", max_staleness=0, weight_bytes=1e12,
                           link_bytes_per_s=1e9, **QUIET))
    assert r.stalled and r.samples_per_s == 0.0


def _toy(mode="async", **kw):
    """Trainer and engines both rate-bound: the best split balances them."""
    return SimConfig(mode=mode, max_staleness=2, steps=14, prompts_per_step=32, group_size=4,
                     gen_fixed_s=0.0, gen_row_s=0.0, completion_tokens=100,
                     engine_tokens_per_s=2000.0, train_s=0.0, train_tokens_per_sample=150,
                     train_tokens_per_s_per_gpu=1500.0, env_median_s=0.2, env_sigma=1.0,
                     env_workers=64, **kw)


def _split(cfg, trainer, gpus, **kw):
    return replace(cfg, trainer_gpus=trainer, engines=gpus - trainer, **kw)


def test_size_cluster_finds_the_best_split_of_an_exhaustive_search():
    gpus = 24  # 23 splits: more than one coarse grid, so the refinement runs
    plan = size_cluster(_toy(), gpus)
    brute = {t: simulate(_split(_toy(), t, gpus)).samples_per_s for t in range(1, gpus)}
    assert plan.trainer_gpus == max(brute, key=brute.get)
    assert plan.engines == gpus - plan.trainer_gpus
    assert plan.result.samples_per_s == brute[plan.trainer_gpus]
    assert len(plan.tried) < len(brute)  # it did not simulate every split
    # the pool it reports keeps within 2% of the given pool's throughput; a quarter of it not
    need = plan.env_workers_needed
    assert 1 <= need <= 64
    at, quarter = (simulate(_split(_toy(), plan.trainer_gpus, gpus, env_workers=w))
                   for w in (need, max(need // 4, 1)))
    assert at.samples_per_s >= 0.98 * plan.result.samples_per_s
    assert quarter.samples_per_s < 0.98 * plan.result.samples_per_s


def test_size_cluster_sync_is_colocated_and_node_steps_are_respected():
    sync = size_cluster(_toy(mode="sync"), 16)
    assert (sync.trainer_gpus, sync.engines) == (16, 16) and len(sync.tried) == 1
    nodes = size_cluster(_toy(), 32, step=8)
    assert nodes.trainer_gpus % 8 == 0 and nodes.engines == 32 - nodes.trainer_gpus
