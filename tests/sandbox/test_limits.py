"""Resource attacks: runaway CPU, sleeping, fork bombs, memory, disk, inodes, output, segfaults.
Each asserts the verdict is not success, the limit is recorded, and the slot is reusable."""

import asyncio
import signal

import pytest

from tests.sandbox.conftest import MiB, NOT_A_BOUNDARY, SMALL, assert_reusable, run, skip_unless
from traingym.sandbox import Limits
from traingym.sandbox.bwrap import BASE_PROCESSES


def test_infinite_loop_hits_cpu_limit(backend):
    async def body(sb):
        r = await sb.exec("while True: pass", limits=Limits(cpu_s=1, wall_s=10))
        assert not r.ok and r.killed_reason == "cpu", r
        assert r.events and r.wall_s < 5
        await assert_reusable(sb)

    run(backend, body)


def test_long_sleep_hits_wall_limit(backend):
    async def body(sb):
        r = await sb.exec("import time; time.sleep(100)", limits=Limits(wall_s=0.5))
        assert not r.ok and r.timed_out and r.killed_reason == "wall", r
        assert r.wall_s < 2
        r = await sb.exec(["sleep", "100"], limits=Limits(wall_s=0.3))
        assert r.timed_out and r.killed_reason == "wall"
        await assert_reusable(sb)

    run(backend, body)


FORK_BOMB = """
import os
while True:
    try:
        os.fork()
    except OSError:
        pass
"""


def test_fork_bomb_is_contained(backend):
    skip_unless(backend, ("bwrap",), NOT_A_BOUNDARY + "RLIMIT_NPROC does not bind root and counts "
                "all of the user's processes, so a fork bomb would reach the host")

    async def body(sb):
        r = await sb.exec(FORK_BOMB, limits=Limits(processes=32, wall_s=1.5, cpu_s=5))
        assert not r.ok and r.killed_reason == "wall", r
        assert "process limit hit: forks were refused" in r.events
        pids = sb.group.pids
        if (pids / "pids.peak").exists():
            assert int((pids / "pids.peak").read_text()) <= 32 + BASE_PROCESSES
        for _ in range(100):  # every process of the bomb is gone (bwrap, init, agent remain)
            if int((pids / "pids.current").read_text()) <= BASE_PROCESSES:
                break
            await asyncio.sleep(0.01)
        assert int((pids / "pids.current").read_text()) <= BASE_PROCESSES
        await assert_reusable(sb)

    run(backend, body)


MEMORY_BOMB = """
chunks = []
while True:
    chunks.append(bytearray(8 << 20))
"""


def test_memory_bomb_is_stopped(backend):
    async def body(sb):
        r = await sb.exec(MEMORY_BOMB, limits=Limits(memory_bytes=256 * MiB, wall_s=10))
        assert not r.ok, r
        if backend == "bwrap":  # a memory cgroup kills it and says so
            assert r.killed_reason == "memory" and r.signal == signal.SIGKILL, r
            assert any("out of memory" in e for e in r.events)
        else:  # RLIMIT_AS: the allocation fails
            assert b"MemoryError" in r.stderr, r
        assert r.max_rss_bytes < 256 * MiB + 128 * MiB
        await assert_reusable(sb)

    run(backend, body)


def test_big_file_hits_file_size_limit(backend):
    async def body(sb):
        code = "f = open('big', 'wb')\nwhile True: f.write(b'x' * (1 << 20))"
        r = await sb.exec(code, limits=Limits(file_bytes=4 * MiB))
        assert not r.ok and r.signal == signal.SIGXFSZ, r
        assert "killed by signal SIGXFSZ" in r.events
        await assert_reusable(sb)

    run(backend, body)


def test_disk_flood_fills_only_the_private_tmpfs(backend):
    skip_unless(backend, ("bwrap",), NOT_A_BOUNDARY + "its workspace is a host directory with "
                "no size cap; only RLIMIT_FSIZE bounds each file")

    async def body(sb):
        code = ("import itertools\nfor i in itertools.count():\n"
                "    open(f'f{i}', 'wb').write(b'x' * (1 << 20))")
        r = await sb.exec(code, limits=Limits(file_bytes=4 * MiB, wall_s=10))
        assert not r.ok and b"No space left on device" in r.stderr, r
        for where in ("/tmp", "/dev/shm"):  # the other tmpfs mounts are separate and capped too
            r = await sb.exec(f"open('{where}/x', 'wb').write(b'x' * (20 << 20))",
                              limits=Limits(file_bytes=None))
            assert not r.ok and b"No space left" in r.stderr, r
        await sb.reset()
        r = await sb.exec("import os; print(len(os.listdir('.')))")
        assert r.stdout == b"0\n"
        await sb.write_file("after.txt", b"ok")
        await assert_reusable(sb)

    run(backend, body)


def test_inode_flood_is_bounded(backend):
    skip_unless(backend, ("bwrap",), NOT_A_BOUNDARY + "it creates inodes on the host filesystem")

    async def body(sb):
        code = "import itertools\nfor i in itertools.count(): open(f'e{i}', 'wb').close()"
        r = await sb.exec(code, limits=Limits(wall_s=1.0))
        assert not r.ok and r.killed_reason in ("wall", "memory"), r
        await sb.reset()
        r = await sb.exec("import os; print(len(os.listdir('.')))")
        assert r.stdout == b"0\n"

    run(backend, body, scratch_bytes=4 * MiB)


def test_gigabytes_of_output_are_capped(backend):
    async def body(sb):
        code = "import sys\nwhile True: sys.stdout.buffer.write(b'y' * 65536)"
        r = await sb.exec(code, limits=Limits(output_bytes=1 * MiB))
        assert not r.ok and r.killed_reason == "output" and r.truncated, r
        assert len(r.stdout) + len(r.stderr) <= 1 * MiB
        r = await sb.exec(["sh", "-c", "yes 'zzzzzzzz' >&2"], limits=Limits(output_bytes=1 * MiB))
        assert r.killed_reason == "output" and len(r.stderr) == 1 * MiB
        await assert_reusable(sb)

    run(backend, body)


def test_binary_and_ansi_garbage_round_trips(backend):
    async def body(sb):
        code = ("import random, sys\nrng = random.Random(7)\n"
                "data = bytes(rng.randrange(256) for _ in range(200000))\n"
                "sys.stdout.buffer.write(b'\\x1b[2J\\x1b[31m\\x00\\xff' + data)\n"
                "sys.stderr.buffer.write(b'\\x1b]0;title\\x07\\r\\x08')")
        r = await sb.exec(code)
        assert r.ok, r
        import random

        rng = random.Random(7)
        data = bytes(rng.randrange(256) for _ in range(200000))
        assert r.stdout == b"\x1b[2J\x1b[31m\x00\xff" + data
        assert r.stderr == b"\x1b]0;title\x07\r\x08"

    run(backend, body)


@pytest.mark.parametrize("code", ["import ctypes; ctypes.string_at(0)",
                                  "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)"])
def test_segfault_is_recorded(backend, code):
    async def body(sb):
        r = await sb.exec(code)
        assert not r.ok and r.signal == signal.SIGSEGV, r
        assert "killed by signal SIGSEGV" in r.events
        await assert_reusable(sb)

    run(backend, body)


def test_exit_codes_and_exceptions(backend):
    async def body(sb):
        assert (await sb.exec("raise SystemExit(3)")).exit_code == 3
        r = await sb.exec("1/0")
        assert r.exit_code == 1 and b"ZeroDivisionError" in r.stderr
        r = await sb.exec(["/nonexistent/program"])
        assert not r.ok and r.exit_code == 127 and "No such file" in r.error
        r = await sb.exec(["cat"], stdin=b"echo" * 100000)
        assert r.ok and r.stdout == b"echo" * 100000

    run(backend, body, limits=SMALL)
