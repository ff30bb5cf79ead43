"""futures.py on its own: seq_id order per lane, retrieval in any order, failures per future."""

import asyncio
import threading

import pytest

from traingym.tinker.futures import Futures, Lane, UserError


def test_lane_runs_in_seq_order_and_retrieval_in_any_order():
    async def main():
        f = Futures(kept=16)
        f.start(asyncio.get_running_loop())
        ran, gate = [], threading.Event()
        lane = Lane()
        r3 = f.submit(lambda: ran.append(3) or {"n": 3}, lane, 3)  # arrives first
        r2 = f.submit(lambda: ran.append(2) or {"n": 2}, lane, 2)
        assert await f.wait(r3, 0.2) is None  # waits for seq 1: not ready
        r1 = f.submit(lambda: gate.wait(5) and ran.append(1) or {"n": 1}, lane, 1)
        gate.set()
        assert (await f.wait(r3, 5)).json == {"n": 3}  # the last one first
        assert (await f.wait(r1, 5)).json == {"n": 1}
        assert (await f.wait(r2, 5)).json == {"n": 2}
        assert (await f.wait(r2, 5)).json == {"n": 2}  # again
        assert ran == [1, 2, 3]
        with pytest.raises(UserError, match="seq_id 2 was already used"):
            f.submit(dict, lane, 2)
        with pytest.raises(KeyError):
            await f.wait("nope", 0.1)
        f.stop()

    asyncio.run(main())


def test_a_failing_future_fails_alone():
    async def main():
        f = Futures(kept=16)
        f.start(asyncio.get_running_loop())

        def user():
            raise UserError("bad shape")

        def crash():
            raise RuntimeError("boom")

        a, b, c = f.submit(user), f.submit(crash), f.submit(lambda: b"\x01")
        oa, ob, oc = [await f.wait(r, 5) for r in (a, b, c)]
        assert (oa.error, oa.category) == ("bad shape", "user")
        assert ob.category == "server" and "boom" in ob.error
        assert oc.proto == b"\x01"
        f.stop()

    asyncio.run(main())


def test_kept_results_are_bounded():
    async def main():
        f = Futures(kept=16)
        f.start(asyncio.get_running_loop())
        ids = [f.submit(lambda i=i: {"i": i}) for i in range(20)]
        assert (await f.wait(ids[-1], 5)).json == {"i": 19}
        with pytest.raises(KeyError):
            await f.wait(ids[0], 0.1)  # dropped, oldest first
        f.stop()

    asyncio.run(main())


def test_a_refused_request_uses_up_its_seq_id():
    async def main():
        f = Futures(kept=16)
        f.start(asyncio.get_running_loop())
        lane = Lane()
        r2 = f.submit(lambda: {"n": 2}, lane, 2)
        f.skip(lane, 1)  # seq 1 was refused before it was queued
        assert (await f.wait(r2, 5)).json == {"n": 2}
        f.skip(lane, 0)  # already past: nothing to do
        assert lane.next == 3
        f.stop()

    asyncio.run(main())


def test_retrieve_answers_try_again_while_waiting(live):
    """Over HTTP: a future not done within poll_s is answered 408 with the SDK's try_again
    body (the test server's poll_s is 2 s); queued behind a slow job here."""
    import time

    import httpx

    gate = threading.Event()
    rid = live.service.futures.submit(lambda: gate.wait(30) and {"ok": True})
    h = {"X-API-Key": live.key}
    t0 = time.monotonic()
    r = httpx.post(live.url + "/api/v1/retrieve_future", headers=h, json={"request_id": rid},
                   timeout=30)
    assert r.status_code == 408 and r.json()["type"] == "try_again"
    assert time.monotonic() - t0 >= 1.5  # long-polled, not answered at once
    gate.set()
    r = httpx.post(live.url + "/api/v1/retrieve_future", headers=h, json={"request_id": rid},
                   timeout=30)
    assert r.status_code == 200 and r.json() == {"ok": True}
