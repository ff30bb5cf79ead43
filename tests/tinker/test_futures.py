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


def test_completions_log_per_target_with_a_cursor():
    """A target's finished requests in finish order, failed ones too; a poll's cursor trims
    what it acknowledges; an empty poll waits up to its timeout; retrieved ids are dropped
    (only this target's finished ones)."""
    import time

    async def main():
        f = Futures(kept=16)
        f.start(asyncio.get_running_loop())

        def run_many(payloads):
            return [UserError("no") if p == "bad" else {"p": p} for p in payloads]

        a = f.submit_batched("k", "a", run_many, target=("s", 0))
        b = f.submit_batched("k", "bad", run_many, target=("s", 0))
        other = f.submit_batched("k2", "x", run_many, target=("s", 1))
        await f.wait(b, 5), await f.wait(other, 5)
        done, cursor = await f.completions(("s", 0), 0, 1.0)
        assert [rid for rid, _ in done] == [a, b]
        assert done[0][1].json == {"p": "a"} and done[1][1].error == "no"
        t0 = time.monotonic()
        assert await f.completions(("s", 0), cursor, 0.3) == ([], cursor)  # trimmed, waited
        assert time.monotonic() - t0 >= 0.25
        assert await f.completions(("s", 0), cursor, 0) == ([], cursor)  # at once
        c = f.submit_batched("k", "c", run_many, target=("s", 0))
        done, cursor2 = await f.completions(("s", 0), cursor, 5)  # woken by c
        assert [rid for rid, _ in done] == [c] and cursor2 > cursor
        await f.completions(("s", 0), cursor2, 0, retrieved=[a, other])
        with pytest.raises(KeyError):
            await f.wait(a, 0.1)  # retrieved: dropped
        assert (await f.wait(other, 0.1)).json == {"p": "x"}  # not this target's: kept
        gate = threading.Event()
        f.submit(lambda: gate.wait(5) and {})  # hold the worker
        d = f.submit_batched("k", "d", run_many, target=("s", 0))
        await f.completions(("s", 0), cursor2, 0, retrieved=[d])  # not finished: ignored
        gate.set()
        assert (await f.wait(d, 5)).json == {"p": "d"}
        with pytest.raises(KeyError):
            await f.completions(("nope", 0), 0, 0)
        f.stop()

    asyncio.run(main())


def test_sdk_polls_retrieve_futures_out_of_order_and_failed(live, tokenizer):
    """Through the SDK (the server turns sample_use_retrieve_futures on): samples finish while
    the script waits on the last one first; each result is fetched only after the session
    poller's /retrieve_futures reported it (retrieve_future is never answered try_again), and
    a failed sample fails its future alone."""
    import tinker
    from tinker import types

    service = live.service
    sampler = live.client().create_sampling_client(base_model="tiny").result()
    prompts = [types.ModelInput.from_ints(tokenizer.encode(t)) for t in ("What", "What is 1")]
    params = types.SamplingParams(max_tokens=3, temperature=0.0, stop=[])
    alone = [sampler.sample(p, 1, params).result().sequences[0].tokens for p in prompts]
    polls, waits = [], []
    real_poll, real_wait = service.retrieve_futures, service.futures.wait

    def poll(req):
        polls.append(req.prev_cursor)
        return real_poll(req)

    async def wait(rid, timeout):
        out = await real_wait(rid, timeout)
        waits.append(out is not None)
        return out

    service.retrieve_futures, service.futures.wait = poll, wait
    gate = threading.Event()
    try:
        service.futures.submit(lambda: gate.wait(30) and {})  # hold the worker
        futures = [sampler.sample(p, 1, params) for p in prompts]
        bad = sampler.sample(prompts[0], 1, types.SamplingParams(max_tokens=1000))
        gate.set()
        with pytest.raises(tinker.RequestFailedError, match="exceeds the model's context"):
            bad.result()
        got = [futures[1].result(), futures[0].result()]  # the last one first
    finally:
        del service.retrieve_futures, service.futures.wait
    assert [g.sequences[0].tokens for g in got] == alone[::-1]
    assert polls and waits and all(waits)  # polled, and every fetch found its result done


def test_client_config_names_the_transport_the_sdk_builds(live, tmp_path):
    """The client config says use_pyqwest_transport = cfg.client_pyqwest (off by default: the
    SDK then sends over httpx's own transport, whose responses cannot abort the client's exit;
    benchmarks/tinker_client_exit.py), and the SDK's session holder takes it."""
    import httpx
    from fastapi.testclient import TestClient
    from tinker import types

    from traingym.tinker.app import build_app
    from traingym.tinker.config import TinkerConfig
    from traingym.tinker.service import Service

    r = httpx.post(live.url + "/api/v1/client/config", headers={"X-API-Key": live.key},
                   json={"sdk_version": "0.38.0"}, timeout=30)
    sent = types.ClientConfigResponse.model_validate(r.json())
    assert r.status_code == 200 and sent.use_pyqwest_transport is False
    assert sent.sample_use_retrieve_futures is True
    sc = live.client()
    sc.create_sampling_client(base_model="tiny").result()
    assert sc._session_holder.get_client_config().use_pyqwest_transport is False
    sc.close("success").result()

    on = Service(TinkerConfig(runs_dir=tmp_path, models=["tiny"], client_pyqwest=True))
    with TestClient(build_app(on, "tml-unused")) as client:
        r = client.post("/api/v1/client/config", json={"sdk_version": "0.38.0"})
    assert r.status_code == 200 and r.json()["use_pyqwest_transport"] is True
