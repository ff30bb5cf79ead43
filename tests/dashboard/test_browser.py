"""The dashboard's page in a real headless Chromium (issue 15, acceptance 1).

Debian's `chromium` (/usr/bin/chromium, or $TRAINGYM_CHROMIUM; scripts/setup_browser.sh installs
it) driven by Playwright's Python package with that executable: no browser download. The server
is the real command (`python -m traingym.cli dashboard RUNS --port P`) over a folder with a run
IN PROGRESS (its run.lock held, a thread appending a step to events.jsonl every 0.4 s), a
finished run and two eval folders. The tests open the runs list, see the charts drawn with data
(uPlot canvases with the series' colour painted, data-points on each chart), watch new steps
arrive without a reload, open a sample whose completion is `<script>alert(1)</script>` (shown as
text: no script element made, no dialog), open the timeline (span bars drawn; the zoom control
narrows the window) and the run and eval comparisons. Screenshots go to
$TRAINGYM_ARTIFACTS/dashboard (default tests/artifacts/dashboard, git-ignored).

Locally the tests skip when chromium or playwright is absent; under CI they fail (prereq.py).
Not covered: browsers other than Chromium; the page under a token (test_security.py covers the
token on the API).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.request
import zipfile
from pathlib import Path

import pytest
from prereq import missing, require

from traingym.runs import lock as runlock

REPO = Path(__file__).resolve().parents[2]
CHROMIUM = os.environ.get("TRAINGYM_CHROMIUM", "/usr/bin/chromium")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]
ARTIFACTS = Path(os.environ.get("TRAINGYM_ARTIFACTS", REPO / "tests" / "artifacts")) / "dashboard"
XSS = "<script>alert(1)</script>"
FIRST_STEPS = 5
STEP_EVERY_S = 0.4


def step_record(step: int) -> dict:
    return {"step": step, "reward_mean": 0.2 + 0.01 * step, "reward_std": 0.3, "loss": 0.1 / step,
            "kl": 0.001 * step, "entropy": 2.0 - 0.01 * step, "completion_len_mean": 20 + step % 5,
            "completion_len_max": 32, "tokens_per_s": 900.0 + step, "gen_tokens_per_s": 2000.0,
            "mismatch_abs_logp": 1e-4, "mismatch_kl_k3": 1e-7, "seconds_step": 1.5,
            "seconds_rollout": 0.9, "seconds_train": 0.5, "seconds_sync": 0.1,
            "sync_bytes": 400_000 if step % 4 else 1_600_000, "sync_full_bytes": 1_600_000,
            "sync_codec": "delta" if step % 4 else "full", "sync_encode_s": 0.05,
            "sync_apply_s": 0.02, "util_trainer_busy": 0.6, "util_engines_busy": 0.3,
            "wait_trainer_on_rollout_s": 0.8, "wait_sandbox_queue_s": 0.01 * (step % 3),
            "util_env_s": 0.2, "sandbox_failures": step % 2}


def sample_records() -> list[dict]:
    out = [{"sid": f"{s}-{j}", "step": s, "prompt": f"What is {s} + {j}?",
            "completion": f"The answer is {s + j}.", "reward": float(j % 2)}
           for s in range(FIRST_STEPS) for j in range(3)]
    out.append({"sid": "xss", "step": 2, "prompt": "Write some HTML <b>bold</b>",
                "completion": XSS, "reward": 0.0})
    out.append({"sid": "tool", "step": 3, "prompt": "Run the tests", "completion": "done",
                "reward": 1.0,
                # samples.jsonl's multi-turn fields (docs/events.md)
                "messages": [{"role": "policy", "text": "<tool_call>run_tests</tool_call>"},
                             {"role": "env", "text": "2 passed"},
                             {"role": "policy", "text": "done"}],
                "tool_calls": [{"turn": 1, "name": "run_tests", "arguments": {"path": "tests/"}},
                               {"turn": 2, "error": "no JSON object in <tool_call>"}],
                "env_info": [{"status": "pass", "details": "2 passed in 0.12s"}]})
    return out


def trace_events() -> list[dict]:
    meta = [{"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": name}}
            for pid, name in ((1, "trainer"), (2, "engine 0"), (3, "engine 1"))]
    spans = []
    for i in range(FIRST_STEPS):
        t = i * 1_500_000
        spans += [{"ph": "X", "name": "generate", "cat": "rollout", "pid": 2, "tid": 1, "ts": t,
                   "dur": 800_000},
                  {"ph": "X", "name": "generate", "cat": "rollout", "pid": 3, "tid": 1,
                   "ts": t + 50_000, "dur": 700_000},
                  {"ph": "X", "name": "train_step", "cat": "trainer", "pid": 1, "tid": 1,
                   "ts": t + 900_000, "dur": 450_000},
                  {"ph": "X", "name": "weights.encode", "cat": "weights", "pid": 1, "tid": 1,
                   "ts": t + 1_360_000, "dur": 100_000}]
    return meta + spans


def write_run(path: Path, steps: int, mode: str) -> None:
    path.mkdir(parents=True)
    cfg = {"model": {"preset": "tiny"}, "rollout": {"engine": "torch"}, "mode": mode,
           "steps": 200, "algorithm": {"name": "grpo"}, "wandb": {"api_key": "hidden"}}
    (path / "config.json").write_text(json.dumps(cfg))
    (path / "events.jsonl").write_text("".join(json.dumps(step_record(s)) + "\n"
                                               for s in range(1, steps + 1)))


def write_eval(path: Path, sampled: list[float]) -> None:
    path.mkdir(parents=True)
    mean = sum(sampled) / len(sampled)
    summary = {"model": "tiny", "engine": "torch", "seed": 7, "num_prompts": len(sampled),
               "prompts_sha256": "abc",
               "scores": {"sampled": {"mean": mean, "se": 0.05, "n_prompts": len(sampled),
                                      "per_prompt": sampled}}}
    (path / "summary.json").write_text(json.dumps(summary))
    (path / "samples.jsonl").write_text("")


class Appender(threading.Thread):
    """Appends one step record to events.jsonl every STEP_EVERY_S until stopped."""

    def __init__(self, run_dir: Path, start_step: int):
        super().__init__(daemon=True)
        self.path, self.step, self.stop = run_dir / "events.jsonl", start_step, threading.Event()

    def run(self):
        while not self.stop.wait(STEP_EVERY_S):
            self.step += 1
            with open(self.path, "a") as f:
                f.write(json.dumps(step_record(self.step)) + "\n")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def runs_root(tmp_path_factory):
    return tmp_path_factory.mktemp("runs")


@pytest.fixture(scope="module")
def server(runs_root):
    require("fastapi", "the dashboard needs fastapi (pip install 'traingym[dashboard]')")
    root = runs_root
    live = root / "live"
    write_run(live, FIRST_STEPS, "sync")
    (live / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in sample_records()))
    (live / "trace.json").write_text(json.dumps({"traceEvents": trace_events()}))
    write_run(root / "done", 30, "async")
    (root / "done" / "results.json").write_text(json.dumps({"final": {"step": 30}}))
    write_eval(root / "eval-a", [0.0, 0.5, 0.25, 0.5])
    write_eval(root / "eval-b", [0.25, 0.75, 0.5, 0.5])
    lock = runlock.acquire(live)
    appender = Appender(live, FIRST_STEPS)
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "traingym.cli", "dashboard", str(root),
                             "--port", str(port)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"{base}/api/runs", timeout=2).read()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"the dashboard did not start: {proc.communicate()[0]}")
                time.sleep(0.2)
        appender.start()
        yield base
    finally:
        appender.stop.set()
        proc.terminate()
        proc.wait(timeout=20)
        lock.release()


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    if not Path(CHROMIUM).is_file():
        missing(f"no Chromium at {CHROMIUM}: run `bash scripts/setup_browser.sh` "
                "(or set TRAINGYM_CHROMIUM)")
    sync_api = require("playwright.sync_api", "the browser tests need playwright "
                       "(pip install 'traingym[test]')")
    with sync_api.sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            str(tmp_path_factory.mktemp("chromium-profile")), executable_path=CHROMIUM,
            headless=True, args=FLAGS, viewport={"width": 1400, "height": 1000})
        yield context
        context.close()


@pytest.fixture
def page(browser, request):
    """A fresh tab that records page errors, console errors and dialogs; none is allowed."""
    tab = browser.new_page()
    tab.set_default_timeout(60_000)  # a loaded 2-core CI machine
    problems, dialogs = [], []
    tab.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    tab.on("console", lambda m: m.type == "error" and problems.append(f"console: {m.text}"))
    tab.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    tab.dialogs = dialogs
    yield tab
    shot(tab, request.node.name + "-end")
    tab.close()
    assert not dialogs, f"a dialog opened: {dialogs}"
    assert not problems, problems


def shot(tab, name: str) -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    tab.screenshot(path=str(path), full_page=True)
    return path


def points(tab, chart: str) -> int:
    return int(tab.get_attribute(f'[data-chart="{chart}"]', "data-points"))


POINTS_AT_LEAST = """([chart, n]) => {
  const holder = document.querySelector(`[data-chart="${chart}"]`);
  return holder !== null && Number(holder.dataset.points) >= n;
}"""

# Pixels of a chart's canvas painted in its first series' colour (#2563eb, charts.js PALETTE).
PAINTED = """sel => {
  const c = document.querySelector(sel + ' canvas');
  const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
  let n = 0;
  for (let i = 0; i < d.length; i += 4)
    if (Math.abs(d[i] - 37) < 30 && Math.abs(d[i+1] - 99) < 30 && Math.abs(d[i+2] - 235) < 30) n++;
  return n;
}"""


def test_runs_list_shows_status_step_reward(server, page):
    page.goto(server + "/")
    page.wait_for_selector('#runs tr[data-run="live"]')
    row = page.locator('#runs tr[data-run="live"]')
    assert row.locator(".status").text_content() == "running"
    assert page.locator('#runs tr[data-run="done"] .status').text_content() != "running"
    assert page.locator('#evals tr[data-eval="eval-a"]').count() == 1
    shot(page, "runs-list")
    row.locator("a").click()
    page.wait_for_url("**/run/live")


def test_run_page_draws_charts_and_grows_live(server, page):
    page.goto(server + "/run/live")
    # predicates are functions, not expression strings: the page's CSP forbids eval
    page.wait_for_function(POINTS_AT_LEAST, arg=["reward", 5])
    for chart in ("reward", "loss", "kl", "entropy", "lengths", "throughput",
                  "mismatch_abs_logp", "mismatch_kl_k3", "utilisation", "waits", "sync_bytes",
                  "sync_ratio", "sandbox_wait", "env_seconds", "sandbox_failures"):
        assert page.locator(f'[data-chart="{chart}"]').is_visible(), chart
        assert page.locator(f'[data-chart="{chart}"] canvas').count() == 1, chart
    # only the keys the run has: a sync run records no staleness
    assert not page.locator('[data-chart="staleness"]').is_visible()
    assert page.evaluate(PAINTED, '[data-chart="reward"]') > 50
    assert page.locator("#sync-stats").is_visible()
    shot(page, "run-charts")

    page.evaluate("window.__same_page = true")
    before = points(page, "reward")
    page.wait_for_function(POINTS_AT_LEAST, arg=["reward", before + 2], timeout=60_000)
    assert page.evaluate("window.__same_page") is True  # grew in place: no reload
    assert points(page, "loss") > before
    assert int(page.get_attribute("#view", "data-last-step")) > FIRST_STEPS
    shot(page, "run-charts-grown")


def test_a_run_without_steps_gets_its_charts_with_the_first_step(server, runs_root, page):
    fresh = runs_root / "fresh"
    write_run(fresh, 0, "sync")
    page.goto(server + "/run/fresh")
    page.wait_for_selector("#pane-charts .empty")
    assert not page.locator('[data-chart="reward"]').is_visible()
    with open(fresh / "events.jsonl", "a") as f:
        f.write(json.dumps(step_record(1)) + "\n")
    page.wait_for_function(POINTS_AT_LEAST, arg=["reward", 1])
    assert page.locator('[data-chart="reward"]').is_visible()
    assert page.locator("#pane-charts .empty").count() == 0
    assert page.get_attribute("#view", "data-last-step") == "1"


def test_sample_with_script_shows_as_text(server, page):
    page.goto(server + "/run/live#samples")
    page.wait_for_selector("#samples tbody tr")
    page.fill('input[name="q"]', "alert")
    page.click('form.filters button[type="submit"]')
    page.wait_for_selector('#samples tr[data-sid="xss"]')
    assert page.locator("#samples tbody tr").count() == 1
    assert XSS in page.locator('#samples tr[data-sid="xss"]').text_content()
    page.click('#samples tr[data-sid="xss"]')
    page.wait_for_selector('#sample-detail[data-sid="xss"]')
    assert page.locator("#sample-detail pre.completion").text_content() == XSS
    assert page.evaluate("document.scripts.length") == 1  # only the page's own module
    assert page.evaluate("document.querySelectorAll('#view script, #view b').length") == 0
    shot(page, "sample-xss")
    assert not page.dialogs
    page.evaluate("() => alert('probe')")  # the listener does see a dialog when one opens
    assert page.dialogs == ["probe"]
    page.dialogs.clear()


def test_sample_shows_turns_tool_calls_and_sandbox_results(server, page):
    page.goto(server + "/run/live#samples")
    page.wait_for_selector('#samples tr[data-sid="tool"]')
    page.click('#samples tr[data-sid="tool"]')
    detail = page.locator('#sample-detail[data-sid="tool"]')
    detail.wait_for()
    text = detail.text_content()
    for part in ("Turns, policy and environment (3)", "Tool calls (2)", "run_tests (policy turn 1)",
                 "no JSON object in <tool_call>", "Environment and sandbox results (1)",
                 "2 passed in 0.12s"):
        assert part in text, part
    # filters: rewards >= 1 only
    page.fill('input[name="min_reward"]', "1")
    page.click('form.filters button[type="submit"]')
    page.wait_for_function("() => !document.querySelector('#samples tr[data-sid=\"xss\"]')")
    rewards = page.locator("#samples tbody tr td:nth-child(3)").all_text_contents()
    assert rewards and all(float(r) >= 1 for r in rewards)
    shot(page, "sample-tool")


def test_timeline_draws_span_bars_and_zooms(server, page):
    page.goto(server + "/run/live#timeline")
    page.wait_for_selector("#timeline[data-drawn]")
    spans = int(page.get_attribute("#timeline", "data-spans"))
    drawn = int(page.get_attribute("#timeline", "data-drawn"))
    assert spans == 4 * FIRST_STEPS and drawn == spans
    shot(page, "timeline")
    page.eval_on_selector("#timeline-zoom",
                          "z => { z.value = 900; z.dispatchEvent(new Event('input')); }")
    zoomed = int(page.get_attribute("#timeline", "data-drawn"))
    assert 0 < zoomed < drawn
    assert page.locator("#utilisation").is_visible()
    shot(page, "timeline-zoomed")


def test_compare_runs_and_evals(server, page):
    page.goto(server + "/compare?runs=live,done")
    page.wait_for_selector('[data-chart="Reward: mean"] canvas')
    assert page.locator("#compare-runs tbody tr").count() == 2
    legend = page.locator('[data-chart="Reward: mean"] .u-legend').text_content()
    assert "live" in legend and "done" in legend
    assert int(page.get_attribute('[data-chart="Reward: mean"]', "data-points")) >= 30
    shot(page, "compare-runs")
    page.goto(server + "/compare?evals=eval-a,eval-b")
    page.wait_for_selector("#compare-evals tbody tr")
    row = page.locator("#compare-evals tbody tr").first.text_content()
    assert "sampled" in row and "+0.188" in row  # paired difference of the per-prompt scores
    shot(page, "compare-evals")


def test_page_files_ship_in_the_wheel(tmp_path):
    """Every file of static/ is in a wheel built from this tree (package-data), and the page
    has no inline script (the CSP would block it)."""
    static = REPO / "src" / "traingym" / "dashboard" / "static"
    names = {p.name for p in static.iterdir() if p.is_file()}
    assert {"index.html", "app.js", "uplot.esm.js", "uplot.min.css", "uplot.LICENSE"} <= names
    html = (static / "index.html").read_text()
    assert re.findall(r"<script[^>]*>", html) == ['<script type="module" src="/static/app.js">']
    assert not re.search(r"\son[a-z]+\s*=", html)
    tree = tmp_path / "tree"
    shutil.copytree(REPO / "src", tree / "src", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, tree / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                    "--no-build-isolation", "-w", str(tmp_path / "dist"), str(tree)],
                   check=True, capture_output=True)
    (wheel,) = (tmp_path / "dist").glob("traingym-*.whl")
    shipped = {n.rsplit("/", 1)[1] for n in zipfile.ZipFile(wheel).namelist()
               if n.startswith("traingym/dashboard/static/")}
    assert shipped == names
