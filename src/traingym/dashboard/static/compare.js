// Side by side: /compare?runs=a,b overlays the runs' series, one chart per key any of them has;
// /compare?evals=a,b puts evaluations' scores in one table (mean ± se per eval, and for two
// evals on the same prompts the paired difference of per-prompt scores with its standard error).

import { api } from "/static/api.js";
import { PALETTE, SANDBOX_CHARTS, SANDBOX_PREFIX, SYNC_CHARTS, TRAINING_CHARTS, overlayChart } from "/static/charts.js";
import { el, fmt, section, setCrumbs } from "/static/dom.js";
import { changeText } from "/static/runs.js";

const ids = (params, name) => (params.get(name) || "").split(",").map((s) => s.trim()).filter(Boolean);

// {key: {title, format}} for every raw key of the run page's charts, then the sandbox keys
function keyTitles(extraKeys) {
  const titles = new Map();
  for (const spec of [...TRAINING_CHARTS, ...SYNC_CHARTS, ...SANDBOX_CHARTS]) {
    for (const s of spec.series) {
      if (s.key && !titles.has(s.key)) {
        titles.set(s.key, { title: spec.series.length > 1 ? `${spec.title}: ${s.label}` : spec.title,
          format: spec.format });
      }
    }
  }
  for (const key of extraKeys) if (!titles.has(key)) titles.set(key, { title: key });
  return titles;
}

async function compareRuns(view, runIds) {
  setCrumbs(el("a", { href: "/", text: "runs" }), `compare ${runIds.join(", ")}`);
  const { runs: listed } = await api.runs();
  const known = new Map(listed.map((r) => [r.id, r]));
  view.appendChild(section("Runs", el("table", { class: "grid", id: "compare-runs" },
    el("thead", {}, el("tr", {}, ["run", "status", "step", "reward", "held-out Δ"].map((h) => el("th", { text: h })))),
    el("tbody", {}, runIds.map((id) => {
      const r = known.get(id) || {};
      return el("tr", {}, el("td", {}, el("a", { href: `/run/${encodeURIComponent(id)}`, text: id })),
        el("td", { text: r.status ?? "unknown" }), el("td", { class: "num", text: fmt(r.step) }),
        el("td", { class: "num", text: fmt(r.reward, 3) }), el("td", { class: "num", text: changeText(r.heldout_change) }));
    })))));
  const details = await Promise.all(runIds.map((id) => api.run(id)));
  const titles = keyTitles([...new Set(details.flatMap((d) => d.keys || []))]
    .filter((k) => k.startsWith(SANDBOX_PREFIX)).sort());
  const { runs } = await api.compare(runIds, [...titles.keys()]);
  const grid = el("div", { class: "charts" });
  view.appendChild(section("Series", grid));
  for (const [key, { title, format }] of titles) {
    const tables = runIds.map((id, i) => {
      const s = runs[id] || {};
      const step = s.step || [];
      const values = (s[key] || []).map((v) => (typeof v === "number" ? v : null));
      return { label: id, color: PALETTE[i % PALETTE.length], step, values };
    }).filter((t) => t.values.some((v) => v !== null));
    if (tables.length) overlayChart(grid, title, tables, format);
  }
  if (!grid.childElementCount) grid.appendChild(el("p", { class: "muted", text: "These runs have no steps recorded." }));
}

function pairedDiff(a, b) {
  if (!Array.isArray(a) || !Array.isArray(b) || a.length !== b.length || a.length < 2) return null;
  const d = a.map((x, i) => b[i] - x);
  const mean = d.reduce((s, x) => s + x, 0) / d.length;
  const variance = d.reduce((s, x) => s + (x - mean) ** 2, 0) / (d.length - 1);
  return { mean, se: Math.sqrt(variance / d.length) };
}

async function compareEvals(view, evalIds) {
  setCrumbs(el("a", { href: "/", text: "runs" }), `compare evals ${evalIds.join(", ")}`);
  const loaded = await Promise.all(evalIds.map((id) => api.evalOne(id)));
  const summaries = loaded.map((e) => e.summary || e);
  const metrics = [...new Set(summaries.flatMap((s) => Object.keys(s.scores || {})))];
  const samePrompts = summaries.length === 2 && summaries[0].prompts_sha256 &&
    summaries[0].prompts_sha256 === summaries[1].prompts_sha256;
  const head = ["metric", ...evalIds, ...(samePrompts ? [`${evalIds[1]} − ${evalIds[0]} (paired)`] : [])];
  const rows = metrics.map((m) => {
    const cells = summaries.map((s) => {
      const v = (s.scores || {})[m];
      if (v === undefined) return el("td", { text: "–" });
      const mean = typeof v === "object" ? v.mean : v;
      const se = typeof v === "object" ? v.se : null;
      return el("td", { class: "num", text: se != null ? `${fmt(mean, 3)} ± ${fmt(se, 2)}` : fmt(mean, 3) });
    });
    if (samePrompts) {
      const d = pairedDiff(...summaries.map((s) => ((s.scores || {})[m] || {}).per_prompt));
      cells.push(el("td", { class: "num", text: d ? `${d.mean > 0 ? "+" : ""}${fmt(d.mean, 3)} ± ${fmt(d.se, 2)}` : "–" }));
    }
    return el("tr", {}, el("th", { text: m }), cells);
  });
  view.appendChild(section("Scores", el("table", { class: "grid", id: "compare-evals" },
    el("thead", {}, el("tr", {}, head.map((h) => el("th", { text: h })))), el("tbody", {}, rows))));
  const fields = ["model", "engine", "weights", "seed", "num_prompts", "samples_per_prompt",
    "temperature", "max_new_tokens", "prompts_sha256"];
  view.appendChild(section("Settings", el("table", { class: "grid" },
    el("thead", {}, el("tr", {}, ["", ...evalIds].map((h) => el("th", { text: h })))),
    el("tbody", {}, fields.filter((f) => summaries.some((s) => s[f] !== undefined)).map((f) =>
      el("tr", {}, el("th", { text: f }), summaries.map((s) => el("td", { text: fmt(s[f]) }))))))));
}

export async function compareView(view, params) {
  const runIds = ids(params, "runs");
  const evalIds = ids(params, "evals");
  if (runIds.length) await compareRuns(view, runIds);
  if (evalIds.length) await compareEvals(view, evalIds);
  if (!runIds.length && !evalIds.length) {
    view.appendChild(el("p", { class: "muted", text: "Pick runs (or evals) to compare on the runs list: /compare?runs=a,b" }));
  }
}
