"""`traingym report RUN_DIR [--out DIR]`: PNG charts and a one-page HTML summary of a run.

Reads only the run directory (config.json, events.jsonl, samples.jsonl, eval_before.json,
eval_after.json, results.json) and writes to DIR (default RUN_DIR/report): one PNG per chart
whose keys the run has, and report.html, self-contained (charts embedded as data URIs, no
script, no network) with the config summary, the held-out score before and after training,
the last step's figures and a few samples. Every text from the run (model output, prompts,
config values) is escaped with html.escape. Works on a run still going (what is written).

Needs matplotlib (extra `report`); drawn with matplotlib's object API (no pyplot state).
Not covered: the trace's timeline (the dashboard and ui.perfetto.dev show it); comparing runs.
"""

from __future__ import annotations

import base64
import html
import json
import math
from pathlib import Path

from traingym.envs.evaluate import z_text
from traingym.observability.events import read_events, read_samples

# chart name -> (title, keys drawn); a chart is drawn when the run has one of its keys
CHARTS: dict[str, tuple[str, tuple[str, ...]]] = {
    "reward": ("Reward (mean over samples)", ("reward_mean",)),
    "loss": ("Loss", ("loss",)),
    "kl": ("KL to the reference", ("kl",)),
    "entropy": ("Token entropy", ("entropy",)),
    "lengths": ("Completion length (policy tokens)", ("completion_len_mean",
                                                       "completion_len_max")),
    "throughput": ("Throughput (tokens/s)", ("gen_tokens_per_s", "tokens_per_s")),
    "mismatch": ("Train/inference mismatch", ("mismatch_abs_logp", "mismatch_kl_k3")),
    "staleness": ("Staleness (policy versions, async)", ("async_staleness_mean",
                                                          "async_staleness_max")),
}
SUMMARY_KEYS = ("model.path", "task.name", "task.dataset", "mode", "steps", "algorithm.name",
                "rollout.engine", "rollout.prompts_per_step", "rollout.group_size",
                "rollout.max_new_tokens", "trainer.lr", "lora.rank", "cluster.type")


def add_parser(sub) -> None:
    r = sub.add_parser("report", help="write PNG charts and a one-page HTML summary of a run")
    r.add_argument("run_dir", metavar="RUN_DIR", help="a run directory (holds events.jsonl)")
    r.add_argument("--out", help="output folder (default: RUN_DIR/report)")


def main(args) -> int:
    out = write_report(Path(args.run_dir), Path(args.out) if args.out else None)
    print(f"report: {out / 'report.html'}")
    return 0


def _series(events: list[dict], key: str) -> tuple[list[int], list[float]]:
    xs, ys = [], []
    for e in events:
        v = e.get(key)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
            xs.append(e["step"])
            ys.append(float(v))
    return xs, ys


def draw_charts(events: list[dict], out: Path) -> dict[str, Path]:
    """One PNG per chart the run has data for; {chart name: path}."""
    from traingym.core.errors import ConfigError  # heavy: pydantic

    try:
        from matplotlib.figure import Figure
        from matplotlib.ticker import MaxNLocator
    except ModuleNotFoundError:
        raise ConfigError("traingym report draws with matplotlib, which is not installed: "
                          "pip install 'traingym[report]'") from None
    written = {}
    for name, (title, keys) in CHARTS.items():
        lines = [(k, *_series(events, k)) for k in keys]
        lines = [ln for ln in lines if ln[1]]
        if not lines:
            continue
        fig = Figure(figsize=(6.4, 3.4), dpi=100)
        ax = fig.subplots()
        for key, xs, ys in lines:
            ax.plot(xs, ys, marker="o" if len(xs) < 30 else None, markersize=3, label=key)
        if name == "reward":
            xs, std = _series(events, "reward_std")
            _, mean = _series(events, "reward_mean")
            if len(std) == len(mean):
                ax.fill_between(xs, [m - s for m, s in zip(mean, std)],
                                [m + s for m, s in zip(mean, std)], alpha=0.2, label="± std")
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        path = out / f"{name}.png"
        fig.savefig(path)
        written[name] = path
    return written


def _read_json(path: Path) -> dict | None:
    from traingym.core.errors import ConfigError  # heavy: pydantic

    if not path.exists():
        return None
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path} is not valid JSON ({e.msg}); the run may have been "
                          "interrupted while writing it") from None


def _get(config: dict, dotted: str):
    for part in dotted.split("."):
        if not isinstance(config, dict) or part not in config:
            return None
        config = config[part]
    return config


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return html.escape(str(v))


def _heldout(run_dir: Path) -> str:
    before = _read_json(run_dir / "eval_before.json") or {}
    after = _read_json(run_dir / "eval_after.json") or {}
    delta = ((_read_json(run_dir / "results.json") or {}).get("eval") or {}).get("delta") or {}
    if not before and not after:
        return "<p>No held-out evaluation in this run.</p>"
    rows = []
    for metric in sorted(set(before) | set(after)):
        b, a, d = before.get(metric), after.get(metric), delta.get(metric)
        cell = (lambda s: f"{s['mean']:.3f} ± {s['se']:.3f} (n={s['n_prompts']})"
                if s else "—")
        change = f"{d['delta']:+.3f} ± {d['se']:.3f}{z_text(d)}" if d else "—"
        rows.append(f"<tr><td>{html.escape(metric)}</td><td>{cell(b)}</td><td>{cell(a)}</td>"
                    f"<td>{change}</td></tr>")
    return ("<table><tr><th>metric</th><th>before</th><th>after</th>"
            "<th>change (paired over prompts)</th></tr>" + "".join(rows) + "</table>")


def _samples(samples: list[dict], n: int = 4) -> str:
    if not samples:
        return "<p>No samples recorded (observability.samples_per_step = 0?).</p>"
    last = max(s["step"] for s in samples)
    chosen = sorted((s for s in samples if s["step"] == last), key=lambda s: -s["reward"])
    chosen = chosen[: n // 2] + chosen[n // 2:][-(n - n // 2):] if len(chosen) > n else chosen
    parts = []
    for s in chosen:
        parts.append(
            f"<div class=sample><div class=meta>step {s['step']} · sample "
            f"{html.escape(str(s.get('sid', '')))} · reward {s['reward']:.3f}</div>"
            f"<div class=label>prompt</div><pre>{html.escape(s['prompt'])}</pre>"
            f"<div class=label>completion</div><pre>{html.escape(s['completion'])}</pre></div>")
    return (f"<p>Best and worst reward of step {last}.</p>" + "".join(parts))


STYLE = """body{font-family:sans-serif;max-width:1100px;margin:2em auto;color:#222}
table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ccc;padding:3px 8px;
text-align:left;font-size:14px}img{width:520px;margin:4px}pre{white-space:pre-wrap;
background:#f6f6f6;padding:6px;margin:2px 0 8px}.sample{border-top:1px solid #ddd;
padding-top:6px}.meta,.label{font-size:12px;color:#666}"""


def render_html(run_dir: Path, config: dict, events: list[dict], samples: list[dict],
                charts: dict[str, Path]) -> str:
    summary = "".join(f"<tr><td>{k}</td><td>{_fmt(v)}</td></tr>" for k in SUMMARY_KEYS
                      if (v := _get(config, k)) is not None)
    last = events[-1] if events else {}
    figures = "".join(f"<tr><td>{html.escape(k)}</td><td>{_fmt(v)}</td></tr>"
                      for k, v in last.items() if isinstance(v, (int, float, str)))
    images = "".join(
        f'<img alt="{html.escape(name)}" src="data:image/png;base64,'
        f'{base64.b64encode(path.read_bytes()).decode()}">' for name, path in charts.items())
    status = "finished" if (run_dir / "results.json").exists() else "not finished"
    steps = config.get("steps", "?")
    return f"""<!doctype html>
<html><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; img-src data:; style-src 'unsafe-inline'">
<title>traingym report: {html.escape(run_dir.name)}</title><style>{STYLE}</style></head><body>
<h1>traingym run {html.escape(run_dir.name)}</h1>
<p>{status}: {len(events)} step records (last step {last.get('step', '—')} of {_fmt(steps)}).</p>
<h2>Config</h2><table>{summary}</table>
<h2>Held-out reward</h2>{_heldout(run_dir)}
<h2>Charts</h2>{images or '<p>No step records yet.</p>'}
<h2>Last step</h2><table>{figures}</table>
<h2>Samples</h2>{_samples(samples)}
</body></html>
"""


def write_report(run_dir: Path, out: Path | None = None) -> Path:
    """Write the charts and report.html; returns the output folder."""
    from traingym.core.errors import ConfigError  # heavy: pydantic

    if not (run_dir / "events.jsonl").is_file():
        raise FileNotFoundError(f"{run_dir} holds no events.jsonl: not a run directory "
                                "(give the folder a run wrote, e.g. runs/arith-20260101-120000)")
    out = out or run_dir / "report"
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"--out {out}: cannot create it ({e.strerror}); choose another "
                          "folder") from None
    config = _read_json(run_dir / "config.json") or {}
    events = [e for e in read_events(run_dir) if e.get("phase") != "sft"]
    charts = draw_charts(events, out)
    page = render_html(run_dir, config, events, read_samples(run_dir), charts)
    (out / "report.html").write_text(page)
    return out
