"""The warm pool: sizing, clean sessions, crashed workers, start failures, 1,000 submissions."""

import asyncio

import pytest

from tests.sandbox.conftest import SMALL
from tests.sandbox.test_isolation import CHECK, PERSIST
from traingym.sandbox import Limits, SandboxUnavailable, open_sandbox
from traingym.sandbox.pool import SandboxPool, target_size


def factory(backend, limits=SMALL):
    options = {"scratch_bytes": 16 << 20} if backend == "bwrap" else {}
    return lambda: open_sandbox(backend, limits, **options)


def test_target_size_is_littles_law_with_a_sqrt_margin():
    assert target_size(100.0, 0.01, 0.05, z=2.0) == (1, 10)  # 5 + 2*sqrt(5) = 9.47
    assert target_size(1000.0, 0.004, 0.001, z=0.0) == (4, 1)
    assert target_size(0.0, 1.0, 1.0) == (0, 0)
    assert target_size(50.0, 0.2, 0.2, z=3.0) == (10, 20)  # 10 + 3*sqrt(10) = 19.49
    with pytest.raises(ValueError):
        target_size(-1.0, 0.1, 0.1)


def test_pool_arguments_are_checked():
    with pytest.raises(ValueError):
        SandboxPool(factory("process"), min_ready=5, max_size=2)


def test_1000_concurrent_submissions(backend):
    async def main():
        pool = SandboxPool(factory(backend), max_size=4, max_concurrent_starts=2)
        try:
            results = await asyncio.gather(
                *(pool.exec(f"print({i} * 2)") for i in range(1000))
            )
            stats = pool.stats()
        finally:
            await pool.close()
        assert all(r.ok for r in results)
        assert [int(r.stdout) for r in results] == [i * 2 for i in range(1000)]
        assert stats["acquired"] == 1000 and stats["broken"] == 0, stats
        assert stats["started"] <= 8, stats  # reused after reset, not restarted per job
        assert stats["acquire_wait_p99_s"] is not None
        return stats

    asyncio.run(main())


def test_pool_sessions_start_clean(backend):
    if backend != "bwrap":
        pytest.skip("the process backend is not a security boundary: it shares /tmp, IPC and "
                    "the pid space with the host")

    async def main():
        pool = SandboxPool(factory(backend), max_size=1, min_ready=1)
        try:
            assert (await pool.exec(PERSIST)).ok
            r = await pool.exec(CHECK)
            assert pool.stats()["started"] == 1  # the same sandbox, reset in between
        finally:
            await pool.close()
        files, shm, pids = r.stdout.decode().splitlines()
        assert files == "[]" and shm == "[]" and len(eval(pids)) == 3, r

    asyncio.run(main())


def test_crashed_worker_is_replaced(backend):
    if backend != "bwrap":
        pytest.skip("the process backend is not a security boundary: kill(-1) there would "
                    "kill the host user's processes")

    async def main():
        pool = SandboxPool(factory(backend), max_size=2)
        try:
            r = await pool.exec("import os, signal; os.kill(-1, signal.SIGKILL)")
            assert not r.ok and r.killed_reason == "sandbox"
            for _ in range(3):
                assert (await pool.exec("print('ok')")).ok
            stats = pool.stats()
        finally:
            await pool.close()
        assert stats["broken"] >= 1 and stats["started"] >= 2

    asyncio.run(main())


def test_start_failure_is_raised_not_hung():
    async def broken():
        raise SandboxUnavailable("no backend here", "install one")

    async def main():
        pool = SandboxPool(broken, max_size=2)
        try:
            with pytest.raises(SandboxUnavailable):
                await asyncio.wait_for(pool.exec("print(1)"), 10)
            assert pool.stats()["start_failures"] >= 1
        finally:
            await pool.close()

    asyncio.run(main())


def test_sessions_keep_files_between_steps(backend):
    async def main():
        pool = SandboxPool(factory(backend), max_size=2)
        try:
            async with pool.session() as sb:
                await sb.write_file("state.txt", b"1")
                r = await sb.exec("print(open('state.txt').read())", limits=Limits(wall_s=5))
                assert r.stdout == b"1\n"
        finally:
            await pool.close()

    asyncio.run(main())


def test_snapshot_counts_live_and_busy_sandbox_seconds(tmp_path):
    """The sizing state each sandbox_acquire span carries: one sandbox live for ~0.6 s, held
    for ~0.3 s of it, is ~50% utilised; closing the pool leaves none live."""
    from prereq import require_sandbox

    from traingym.core import trace

    require_sandbox("process", SMALL)

    async def main():
        pool = SandboxPool(factory("process"), min_ready=1, max_size=1)
        try:
            await pool.warm(1)
            async with pool.session():
                await asyncio.sleep(0.3)
            await asyncio.sleep(0.3)
            return pool.snapshot(), pool.stats(), pool
        finally:
            await pool.close()

    trace.start(tmp_path / "trace", "engine-0")
    try:
        snap, stats, pool = asyncio.run(main())
    finally:
        trace.stop()
    assert snap["live"] == 1 and snap["acquired"] == 1 and snap["max_size"] == 1
    assert 0.3 <= snap["busy_s"] < 0.45
    assert snap["live_s"] >= 0.6
    assert 0.25 < stats["utilisation_mean"] < 0.75
    assert pool.live == 0
    (span,) = [e for e in trace.collect(tmp_path)["traceEvents"] if e["name"] == "sandbox_acquire"]
    assert span["args"]["live"] == 1 and span["args"]["in_use"] == 1
    assert {"target_busy", "target_buffer", "rate_per_s", "hold_s", "ready_s"} <= set(span["args"])
