// The runs list (status, step, reward, held-out change, age) refreshed every 5 s, and the eval
// folders; checkboxes pick runs or evals to compare side by side.

import { api } from "/static/api.js";
import { el, clear, fmt, fmtAge, section, setCrumbs, showError } from "/static/dom.js";

const REFRESH_MS = 5000;

// heldout_change: {metric, delta, se, z} (paired after - before), or null
export function changeText(change) {
  if (!change || typeof change.delta !== "number") return "–";
  const se = typeof change.se === "number" ? ` ± ${fmt(change.se, 2)}` : "";
  return `${change.delta > 0 ? "+" : ""}${fmt(change.delta, 3)}${se} (${change.metric})`;
}

function runRow(run, selected) {
  const box = el("input", { type: "checkbox", checked: selected.has(run.id),
    "aria-label": `select ${run.id}`,
    onchange: (e) => (e.target.checked ? selected.add(run.id) : selected.delete(run.id)) });
  const steps = run.steps ? `${fmt(run.step)} / ${fmt(run.steps)}` : fmt(run.step);
  const delta = run.heldout_change && run.heldout_change.delta;
  return el("tr", { dataset: { run: run.id } },
    el("td", {}, box),
    el("td", {}, el("a", { href: `/run/${encodeURIComponent(run.id)}`, text: run.id })),
    el("td", {}, el("span", { class: `status status-${run.status}`, text: run.status })),
    el("td", { class: "num", text: steps }),
    el("td", { class: "num", text: fmt(run.reward, 3) }),
    el("td", { class: `num ${delta > 0 ? "up" : delta < 0 ? "down" : ""}`, text: changeText(run.heldout_change) }),
    el("td", { class: "num", text: fmtAge(run.age_s) }),
    el("td", { text: [run.mode, run.engine, run.algorithm].filter(Boolean).join(" · ") }));
}

function runsTable(runs, selected) {
  const head = ["", "run", "status", "step", "reward", "held-out Δ", "age", "mode · engine · algorithm"];
  return el("table", { class: "grid", id: "runs" },
    el("thead", {}, el("tr", {}, head.map((h) => el("th", { text: h })))),
    el("tbody", {}, runs.map((r) => runRow(r, selected))));
}

function evalScores(item) {
  const scores = item.scores || (item.summary && item.summary.scores) || {};
  return Object.entries(scores).map(([name, s]) =>
    `${name} ${fmt(s && typeof s === "object" ? s.mean : s, 3)}`).join(" · ");
}

function evalsTable(evals, selected) {
  const rows = evals.map((item) => el("tr", { dataset: { eval: item.id } },
    el("td", {}, el("input", { type: "checkbox", "aria-label": `select ${item.id}`,
      onchange: (e) => (e.target.checked ? selected.add(item.id) : selected.delete(item.id)) })),
    el("td", { text: item.id }),
    el("td", { text: fmt(item.model ?? (item.summary && item.summary.model)) }),
    el("td", { text: evalScores(item) })));
  return el("table", { class: "grid", id: "evals" },
    el("thead", {}, el("tr", {}, ["", "eval", "model", "scores"].map((h) => el("th", { text: h })))),
    el("tbody", {}, rows));
}

function compareButton(label, selected, param) {
  return el("button", { type: "button", text: label, onclick: () => {
    if (selected.size < 2) return showError(`pick at least two to compare (${selected.size} picked)`);
    window.location.href = `/compare?${param}=${[...selected].map(encodeURIComponent).join(",")}`;
  } });
}

export async function runsView(view) {
  setCrumbs("runs");
  const selected = new Set();
  const holder = el("div");
  view.appendChild(section("Runs", holder, el("p", { class: "actions" },
    compareButton("Compare selected runs", selected, "runs"))));
  const refresh = async () => {
    const { runs } = await api.runs();
    clear(holder).appendChild(runs.length ? runsTable(runs, selected)
      : el("p", { class: "muted", text: "No run directories in this folder yet." }));
  };
  await refresh();
  setInterval(() => refresh().catch(showError), REFRESH_MS);

  const evals = (await api.evals()).evals || [];
  if (evals.length) {
    const picked = new Set();
    view.appendChild(section("Evaluations", evalsTable(evals, picked),
      el("p", { class: "actions" }, compareButton("Compare selected evals", picked, "evals"))));
  }
}
