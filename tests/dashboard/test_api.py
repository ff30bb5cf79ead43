"""The dashboard's JSON API (docs/dashboard.md) over synthetic run directories, in process
(FastAPI's TestClient): runs and evals lists, run detail, incremental events (live appends,
partial lines, a resume that truncates), downsampled series, samples search/filter/paging and
by sid, the trace, comparison, and a 100,000-sample query under 1 s."""

import json
import math
import time

import pytest
from dashboard_runs import event, make_eval, make_run, sample, write_jsonl
from prereq import require

require("fastapi", "the dashboard tests need fastapi (pip install 'traingym[dashboard]')")
require("httpx", "FastAPI's TestClient needs httpx (pip install 'traingym[test]')")

from fastapi.testclient import TestClient  # noqa: E402

from traingym.dashboard.app import build_app  # noqa: E402
from traingym.dashboard.index import SamplesIndex  # noqa: E402


def client(root) -> TestClient:
    return TestClient(build_app(root), base_url="http://127.0.0.1")


def get(c: TestClient, url: str, status: int = 200):
    r = c.get(url)
    assert r.status_code == status, (url, r.status_code, r.text)
    assert r.headers["content-type"].startswith("application/json")
    return r.json()


def test_runs_list_detail_and_evals(tmp_path):
    make_run(tmp_path, "done", steps=4, total=4, finished=True,
             weights={"codec": "delta"}, hub={"hf_token": "hf_abc", "apiKey": "k1", "repo": "me/x"},
             observability={"sinks": ["wandb"], "sink_options": {"wandb": {"api_key": "w"}}})
    make_run(tmp_path, "stopped", steps=2, total=10)
    ck = tmp_path / "stopped" / "checkpoints"
    (ck / "step_2").mkdir(parents=True)
    (ck / "step_2" / "COMMITTED").write_text("")
    (ck / "step_1").mkdir()  # not committed: not listed
    make_eval(tmp_path, "ev1")
    (tmp_path / "notes").mkdir()  # neither a run nor an eval
    (tmp_path / "file.txt").write_text("x")
    c = client(tmp_path)

    runs = {r["id"]: r for r in get(c, "/api/runs")["runs"]}
    assert set(runs) == {"done", "stopped"}
    done = runs["done"]
    assert done["status"] == "finished" and done["step"] == 4 and done["steps"] == 4
    assert done["reward"] == pytest.approx(0.04)
    assert done["heldout_change"] == {"metric": "sampled", "delta": 0.05, "se": 0.01, "z": 5.0}
    assert (done["mode"], done["engine"], done["algorithm"]) == ("sync", "torch", "grpo")
    assert 0 <= done["age_s"] < 60
    assert runs["stopped"]["status"] == "preempted"  # checkpoint of its last step, 2 < 10
    assert runs["stopped"]["heldout_change"] is None

    d = get(c, "/api/runs/stopped")
    assert d["checkpoints"] == [2]
    d = get(c, "/api/runs/done")
    assert d["config"]["hub"] == {"hf_token": "***", "apiKey": "***", "repo": "me/x"}
    assert d["config"]["observability"]["sink_options"]["wandb"]["api_key"] == "***"
    assert d["config"]["rollout"]["max_new_tokens"] == 4  # not a secret
    assert d["results"]["final"]["step"] == 4
    assert {"reward_mean", "loss", "sync_bytes"} <= set(d["keys"])
    assert d["sync"]["syncs"] == 4 and d["sync"]["bytes_total"] == 100 * (1 + 2 + 3 + 4)
    assert d["sync"]["ratio"] == pytest.approx(1000 / 4000)
    assert d["sync"]["codecs"] == {"delta": 2, "full": 2}
    assert d["sync"]["seconds_mean"]["sync_encode_s"] == pytest.approx(2.5)
    assert d["sandbox"] == {} and d["sandbox_verdicts"] == {}

    evals = get(c, "/api/evals")["evals"]
    assert [e["id"] for e in evals] == ["ev1"]
    assert evals[0]["scores"] == {"greedy": 0.25, "sampled": 0.5}
    one = get(c, "/api/evals/ev1")
    assert one["samples_total"] == 6 and one["summary"]["config"]["api_key"] == "***"
    page = get(c, "/api/evals/ev1/samples?min_reward=0.5")
    assert page["total"] == 3 and [i["sid"] for i in page["items"]] == ["L3", "L4", "L5"]
    assert get(c, "/api/evals/ev1/samples/L2")["prompt"] == "eval prompt 2"

    for bad in ("/api/runs/nope", "/api/runs/ev1", "/api/evals/done", "/api/runs/notes",
                "/api/runs/.hidden", "/api/runs/done/samples/L999"):
        assert "detail" in get(c, bad, 404)


def test_events_incremental_live_partial_line_and_resume(tmp_path):
    run = make_run(tmp_path, "r", steps=5)
    c = client(tmp_path)
    ans = get(c, "/api/runs/r/events?after=3")
    assert [e["step"] for e in ans["events"]] == [4, 5] and ans["last"] == 5
    assert ans["more"] is False
    ans = get(c, "/api/runs/r/events?after=0&limit=2")
    assert [e["step"] for e in ans["events"]] == [1, 2] and ans["last"] == 2 and ans["more"]
    assert ans["events"][0] == json.loads(json.dumps(event(1)))  # every key, as written
    assert get(c, "/api/runs/r/events?after=5") == {"events": [], "last": 5, "more": False}

    # the run appends a step and half of the next line: the poll sees the complete one only
    with open(run / "events.jsonl", "a") as f:
        f.write(json.dumps(event(6)) + "\n" + json.dumps(event(7))[:20])
    ans = get(c, "/api/runs/r/events?after=5")
    assert [e["step"] for e in ans["events"]] == [6]
    with open(run / "events.jsonl", "a") as f:
        f.write(json.dumps(event(7))[20:] + "\n")
    assert [e["step"] for e in get(c, "/api/runs/r/events?after=6")["events"]] == [7]
    assert get(c, "/api/runs")["runs"][0]["step"] == 7

    # resume: the file is truncated to step 3 and steps 4.. are redone with other values;
    # here the rewritten file is even longer than what was read, so only the content tells
    write_jsonl(run / "events.jsonl", [event(s, loss=-s, note="x" * 400) for s in range(1, 9)])
    ans = get(c, "/api/runs/r/events?after=0")
    assert [e["step"] for e in ans["events"]] == list(range(1, 9))
    assert [e["loss"] for e in ans["events"]] == [-s for s in range(1, 9)]
    # a shorter rewrite
    write_jsonl(run / "events.jsonl", [event(s, loss=10 * s) for s in range(1, 3)])
    assert get(c, "/api/runs/r/series?keys=loss")["loss"] == [10, 20]

    # a damaged line is skipped and counted, never fatal
    with open(run / "events.jsonl", "a") as f:
        f.write("{not json\n" + json.dumps(event(3)) + "\n")
    assert get(c, "/api/runs/r/series?keys=loss")["step"] == [1, 2, 3]
    assert get(c, "/api/runs/r")["bad_lines"] == {"events": 1, "samples": 0}


def test_sandbox_stats_and_verdicts(tmp_path):
    run = make_run(tmp_path, "code", steps=0)
    write_jsonl(run / "events.jsonl", [event(s, wait_sandbox_queue_s=0.5 * s, util_env_s=2.0)
                                       for s in range(1, 5)])
    write_jsonl(run / "samples.jsonl", [
        sample(1, 0, env_info=[{"status": "pass", "details": []}]),
        sample(1, 1, env_info=[{"status": "fail"}, {"status": "sandbox_limit"}]),
        sample(1, 2, env_info=[{"status": "fail"}]), sample(1, 3)])
    d = get(client(tmp_path), "/api/runs/code")
    assert d["sandbox"]["wait_sandbox_queue_s"] == {"last": 2.0, "mean": 1.25, "max": 2.0,
                                                    "total": 5.0}
    assert d["sandbox"]["util_env_s"]["total"] == 8.0
    assert d["sandbox_verdicts"] == {"pass": 1, "fail": 2, "sandbox_limit": 1}


def test_sft_records_share_step_zero_without_rereading(tmp_path):
    from traingym.dashboard.index import EventsIndex

    path = tmp_path / "events.jsonl"
    sft = [{"phase": "sft", "step": 0, "sft_step": i, "sft_steps": 3, "loss": 3.0 - i}
           for i in range(1, 4)]
    write_jsonl(path, sft[:2])
    index = EventsIndex(path)
    index.refresh()
    write_jsonl(path, [sft[2]], "a")
    index.refresh()
    write_jsonl(path, [event(1)], "a")
    index.refresh()
    assert index.steps == [0, 0, 0, 1] and index.resets == 0
    assert index.columns["sft_step"][:3] == [1, 2, 3]
    write_jsonl(path, [event(1, loss=-1.0)], "a")  # step 1 again, not SFT: a rewrite
    index.refresh()
    assert index.resets == 1


def test_series_downsampled_with_nulls(tmp_path):
    run = make_run(tmp_path, "r", steps=0)
    recs = [event(s, loss=float(s)) for s in range(1, 11)]
    recs[4]["loss"] = math.nan  # written by json as NaN
    del recs[5]["loss"]
    write_jsonl(run / "events.jsonl", recs)
    c = client(tmp_path)
    s = get(c, "/api/runs/r/series?keys=loss,nothing&max_points=3")
    # buckets of ceil(10/3)=4 records: steps 1-4, 5-8, 9-10; means of the numbers present
    assert s["step"] == [4, 8, 10]
    assert s["loss"] == [2.5, pytest.approx((7 + 8) / 2), 9.5]
    assert s["nothing"] == [None, None, None]
    full = get(c, "/api/runs/r/series?keys=loss")
    assert full["step"] == list(range(1, 11)) and full["loss"][4] is None
    assert full["loss"][5] is None and full["loss"][9] == 10.0
    ev = get(c, "/api/runs/r/events?after=4&limit=1")["events"][0]
    assert ev["loss"] is None  # NaN goes out as null: the answer stays valid JSON
    get(c, "/api/runs/r/series?keys=a%20b", 400)
    get(c, "/api/runs/r/series?keys=loss&max_points=0", 422)


def test_samples_search_filter_paging_and_sid(tmp_path):
    run = make_run(tmp_path, "r", steps=0)
    recs = [sample(s, k) for s in range(5) for k in range(4)]  # 20, line n: sid L<n>
    recs[7]["completion"] = "The ANSWER is " + "y" * 1000
    recs[9]["sid"] = "g2-s1"
    write_jsonl(run / "samples.jsonl", recs)
    c = client(tmp_path)
    page = get(c, "/api/runs/r/samples?limit=3")
    assert page["total"] == 20 and [i["sid"] for i in page["items"]] == ["L19", "L18", "L17"]
    assert get(c, "/api/runs/r/samples?limit=2&offset=18&order=asc")["items"][0]["sid"] == "L18"
    ans = get(c, "/api/runs/r/samples?q=the%20answer")
    assert ans["total"] == 1 and ans["items"][0]["sid"] == "L7"
    assert len(ans["items"][0]["completion"]) == 300
    assert len(get(c, "/api/runs/r/samples/L7")["completion"]) == 1014
    ans = get(c, "/api/runs/r/samples?step=2&min_reward=0.25&max_reward=0.5&order=asc")
    assert [(i["step"], i["reward"]) for i in ans["items"]] == [(2, 0.25), (2, 0.5)]
    assert get(c, "/api/runs/r/samples?q=what%20is%203%20%2B")["total"] == 4
    assert get(c, "/api/runs/r/samples?q=nowhere")["total"] == 0
    rec = get(c, "/api/runs/r/samples/g2-s1")
    assert rec == {**recs[9]} and "L9" not in [i["sid"] for i in
                                              get(c, "/api/runs/r/samples?limit=500")["items"]]
    # live: appended samples are found on the next query
    write_jsonl(run / "samples.jsonl", [sample(9, 0, completion="late arrival")], "a")
    assert get(c, "/api/runs/r/samples?q=LATE")["items"][0]["sid"] == "L20"
    get(c, "/api/runs/r/samples?order=sideways", 400)
    get(c, "/api/runs/r/samples?limit=501", 422)


def test_query_over_100k_samples_under_a_second(tmp_path):
    path = tmp_path / "samples.jsonl"
    with open(path, "w") as f:
        for i in range(100_000):
            f.write(json.dumps({"step": i // 10, "prompt": f"What is {i} + {i % 7}?",
                                "completion": f"The answer is {i + i % 7}.",
                                "reward": (i % 5) / 4}) + "\n")
    index = SamplesIndex(path)
    index.refresh()
    assert len(index) == 100_000
    t = time.perf_counter()
    total, page = index.query("answer is 4", min_reward=0.5, limit=50)
    items = index.read_many(page)
    took = time.perf_counter() - t
    assert total > 0 and all("answer is 4" in r["completion"] for r in items)
    assert all(r["reward"] >= 0.5 for r in items)
    assert took < 1.0, f"a query over 100,000 samples took {took:.2f} s"


def test_trace_and_compare(tmp_path):
    run = make_run(tmp_path, "a", steps=3)
    make_run(tmp_path, "b", steps=2)
    events = [{"ph": "M", "name": "process_name", "pid": 1, "tid": 0, "args": {"name": "trainer"}},
              {"ph": "M", "name": "thread_name", "pid": 1, "tid": 7, "args": {"name": "main"}},
              {"ph": "M", "name": "process_name", "pid": 2, "tid": 0,
               "args": {"name": "engine-0"}},
              {"ph": "X", "name": "train_step", "cat": "trainer", "pid": 1, "tid": 7,
               "ts": 0, "dur": 400},
              {"ph": "X", "name": "forward", "cat": "trainer", "pid": 1, "tid": 7,
               "ts": 100, "dur": 100},
              {"ph": "X", "name": "publish", "cat": "weights", "pid": 1, "tid": 7,
               "ts": 600, "dur": 400},
              {"ph": "X", "name": "generate", "cat": "engine", "pid": 2, "tid": 1,
               "ts": 0, "dur": 1000}]
    (run / "trace.json").write_text(json.dumps({"traceEvents": events}))
    c = client(tmp_path)
    t = get(c, "/api/runs/a/trace")
    assert [p["name"] for p in t["processes"]] == ["engine-0", "trainer"]
    trainer = next(p for p in t["processes"] if p["name"] == "trainer")
    assert trainer["threads"] == {"7": "main"}
    assert {(s["name"], s["ts"], s["dur"]) for s in t["spans"]} >= {("forward", 100, 100)}
    assert len(t["spans"]) == 4
    assert t["utilisation"]["trainer"]["busy_frac"] == pytest.approx(0.8)  # 800 of 1000 us
    assert t["utilisation"]["engine-0"]["busy_frac"] == 1.0
    assert len(get(c, "/api/runs/a/trace?max_events=2")["spans"]) == 2
    assert get(c, "/api/runs/b/trace")["spans"] == []
    (tmp_path / "b" / "trace").mkdir()  # a live run's shard with a damaged line
    (tmp_path / "b" / "trace" / "trainer-9.jsonl").write_text('{"ph": "X", bad\n{}\n')
    err = get(c, "/api/runs/b/trace", 500)["detail"]
    assert "trace cannot be read" in err and "trainer-9.jsonl" in err
    assert str(tmp_path) not in err

    cmp = get(c, "/api/compare?runs=a,b&keys=reward_mean")["runs"]
    assert cmp["a"]["step"] == [1, 2, 3] and cmp["b"]["reward_mean"] == [0.01, 0.02]
    get(c, "/api/compare?runs=a,zz&keys=loss", 404)


def test_pages_static_files_and_head(tmp_path):
    static = tmp_path / "static"
    (static / "vendor").mkdir(parents=True)
    (static / "index.html").write_text("<!doctype html><title>t</title>")
    (static / "app.js").write_text("export const x = 1;")
    (static / "vendor" / "lib.js").write_text("//lib")
    runs = tmp_path / "runs"
    make_run(runs, "r", steps=1)
    c = TestClient(build_app(runs, static=static), base_url="http://127.0.0.1")
    for url in ("/", "/run/r", "/compare?runs=r"):
        r = c.get(url)
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    r = c.get("/static/app.js")
    assert r.headers["content-type"].startswith("text/javascript") and "x = 1" in r.text
    assert c.get("/static/vendor/lib.js").text == "//lib"
    # a file added after start is not served: the listing is made once
    (static / "late.js").write_text("1")
    assert c.get("/static/late.js").status_code == 404
    r = c.head("/api/runs")
    assert r.status_code == 200 and r.content == b""
