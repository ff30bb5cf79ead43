// One run: a summary line, then tabs (by hash) for charts, samples, timeline and details.
// Charts load a downsampled series once, then poll /events?after=last every 2 s and append
// the new steps in place (no reload). #view carries data-last-step for the browser tests.

import { api } from "/static/api.js";
import { Board, SANDBOX_CHARTS, SANDBOX_PREFIX, SYNC_CHARTS, TRAINING_CHARTS, specKeys } from "/static/charts.js";
import { el, fmt, fmtBytes, kvTable, section, setCrumbs, showError } from "/static/dom.js";
import { samplesView } from "/static/samples.js";
import { timelineView } from "/static/timeline.js";

const POLL_MS = 2000;
const TABS = ["charts", "samples", "timeline", "details"];

// info.sync: {syncs, bytes_total, full_bytes_total, ratio, seconds_mean: {k: s}, codecs, last}
function syncStats(sync) {
  if (!sync || !sync.syncs) return null;
  const codecs = Object.entries(sync.codecs || {}).map(([c, n]) => `${c} ×${n}`).join(", ");
  const seconds = Object.fromEntries(Object.entries(sync.seconds_mean || {})
    .filter(([, v]) => typeof v === "number"));
  return el("div", { class: "stats", id: "sync-stats" },
    kvTable({ syncs: sync.syncs, "bytes sent": fmtBytes(sync.bytes_total),
      "full size (sum)": fmtBytes(sync.full_bytes_total),
      "sent / full": sync.ratio == null ? null : fmt(sync.ratio, 3), codecs: codecs || null }),
    Object.keys(seconds).length ? el("div", {}, el("h3", { text: "mean seconds per sync" }),
      kvTable(seconds, (v) => `${fmt(v, 3)} s`)) : null);
}

// info.sandbox: {key: {last, mean, max}} of the sandbox_* keys
function sandboxStats(sandbox) {
  const entries = Object.entries(sandbox || {});
  if (!entries.length) return null;
  return el("table", { class: "grid stats", id: "sandbox-stats" },
    el("thead", {}, el("tr", {}, ["", "last", "mean", "max"].map((h) => el("th", { text: h })))),
    el("tbody", {}, entries.map(([k, v]) => el("tr", {}, el("th", { text: k }),
      ["last", "mean", "max"].map((c) => el("td", { class: "num", text: fmt((v || {})[c], 4) }))))));
}

function evalLine(label, ev) {
  if (!ev) return null;
  const scores = ev.scores || ev;
  const parts = Object.entries(scores).filter(([, s]) => s && typeof s === "object" && "mean" in s)
    .map(([name, s]) => `${name} ${fmt(s.mean, 3)}${s.se != null ? ` ± ${fmt(s.se, 2)}` : ""}`);
  return parts.length ? el("p", {}, el("strong", { text: `${label}: ` }), parts.join(" · ")) : null;
}

function header(id, info) {
  const cfg = info.config || {};
  const bits = [cfg.mode || (cfg.async_ && cfg.async_.enabled ? "async" : null),
    cfg.rollout && cfg.rollout.engine, cfg.algorithm && (cfg.algorithm.name || cfg.algorithm.type)]
    .filter((b) => typeof b === "string");
  return el("div", { class: "run-head" },
    el("h1", { text: id }),
    el("span", { class: `status status-${info.status}`, id: "run-status", text: info.status }),
    el("span", { class: "muted", text: bits.join(" · ") }),
    el("span", { class: "muted", id: "run-step" }));
}

function sandboxSpecs(keys) {
  return keys.sort().map((key) => ({ id: key, title: `Sandbox: ${key.slice(SANDBOX_PREFIX.length)}`,
    series: [{ key, label: key.slice(SANDBOX_PREFIX.length) }] }));
}

function detailsTab(info) {
  const parts = [];
  const evals = [evalLine("held-out before", info.eval_before), evalLine("held-out after", info.eval_after)]
    .filter(Boolean);
  if (evals.length) parts.push(section("Held-out evaluation", ...evals));
  if (info.results) parts.push(section("Results (results.json)", el("pre", { class: "config", text: JSON.stringify(info.results, null, 2) })));
  if (info.bad_lines && info.bad_lines.events) {
    parts.push(section("Unreadable lines", el("p", { text: `events.jsonl: ${info.bad_lines.events} lines that are not JSON records` })));
  }
  if (info.checkpoints) {
    parts.push(section("Checkpoints", el("p", { text: info.checkpoints.length
      ? `steps ${info.checkpoints.join(", ")}` : "none committed" })));
  }
  parts.push(section("Config", el("pre", { class: "config", text: JSON.stringify(info.config, null, 2) })));
  return el("div", {}, parts);
}

export async function runView(view, id) {
  setCrumbs(el("a", { href: "/", text: "runs" }), id);
  const info = await api.run(id);
  view.appendChild(header(id, info));
  const nav = el("nav", { class: "tabs" }, TABS.map((t) => el("a", { href: `#${t}`, dataset: { tab: t }, text: t })));
  const panes = Object.fromEntries(TABS.map((t) => [t, el("div", { class: "pane", id: `pane-${t}`, hidden: true })]));
  view.append(nav, ...Object.values(panes));

  // charts: training, weight sync, sandboxes (only the keys the run has)
  const trainGrid = el("div", { class: "charts" });
  const syncGrid = el("div", { class: "charts" });
  const sandboxGrid = el("div", { class: "charts" });
  const syncTable = syncStats(info.sync);
  const sandboxTable = sandboxStats(info.sandbox);
  const syncSection = section("Weight sync", syncTable, syncGrid);
  const sandboxSection = section("Sandboxes and environments", sandboxTable, sandboxGrid);
  panes.charts.append(trainGrid, syncSection, sandboxSection);
  // info.keys: the numeric keys of the run's recent records; sandbox_* keys get a chart each
  const sandboxSpecList = [...SANDBOX_CHARTS,
    ...sandboxSpecs((info.keys || []).filter((k) => k.startsWith(SANDBOX_PREFIX)))];
  const boards = [new Board(trainGrid, TRAINING_CHARTS), new Board(syncGrid, SYNC_CHARTS),
    new Board(sandboxGrid, sandboxSpecList)];
  const series = await api.series(id, specKeys([...TRAINING_CHARTS, ...SYNC_CHARTS, ...sandboxSpecList]));
  boards.forEach((b) => b.load(series));
  const steps = series.step || [];
  let last = steps.length ? steps[steps.length - 1] : -1;
  const showSections = () => {
    syncSection.hidden = !syncTable && boards[1].shown === 0;
    sandboxSection.hidden = !sandboxTable && boards[2].shown === 0;
    if (trainGrid.childElementCount && boards[0].shown === 0 && !trainGrid.querySelector(".empty")) {
      trainGrid.prepend(el("p", { class: "muted empty", text: "No steps recorded yet; charts appear with the first step." }));
    } else if (boards[0].shown) trainGrid.querySelector(".empty")?.remove();
  };
  const advance = (records, newLast) => {
    boards.forEach((b) => b.append(records));
    if (typeof newLast === "number" && newLast > last) last = newLast;
    view.dataset.lastStep = String(last);
    document.getElementById("run-step").textContent = last >= 0 ? `step ${fmt(last)}` : "no steps yet";
    showSections();
  };
  // steps written between the series and now (and the last step, if downsampling dropped it)
  const tail = await api.events(id, last);
  advance(tail.events, tail.last);

  panes.details.appendChild(detailsTab(info));
  const opened = new Set();
  const openTab = () => {
    const tab = TABS.includes(window.location.hash.slice(1)) ? window.location.hash.slice(1) : "charts";
    for (const t of TABS) {
      panes[t].hidden = t !== tab;
      nav.querySelector(`[data-tab="${t}"]`).classList.toggle("active", t === tab);
    }
    if (tab === "charts") boards.forEach((b) => b.resize());
    if (!opened.has(tab)) {
      opened.add(tab);
      if (tab === "samples") samplesView(panes.samples, id).catch(showError);
      if (tab === "timeline") timelineView(panes.timeline, id).catch(showError);
    }
  };
  window.addEventListener("hashchange", openTab);
  openTab();

  // poll every 2 s while the page is open (a finished run may be resumed); "live" shows while
  // the run holds its lock or new steps came in the last 30 s
  const live = document.getElementById("live");
  let lastNew = info.status === "running" ? Date.now() : 0;
  let pollFailed = false;
  const poll = async () => {
    let more = false;
    try {
      const answer = await api.events(id, last);
      if (answer.events.length) {
        advance(answer.events, answer.last);
        lastNew = Date.now();
      }
      more = Boolean(answer.more); // the server pages by `limit`: fetch the rest at once
      if (pollFailed) document.getElementById("error").hidden = true; // the server is back
      pollFailed = false;
    } catch (err) {
      showError(err);
      pollFailed = true;
    }
    live.hidden = Date.now() - lastNew > 30000;
    setTimeout(poll, more ? 0 : POLL_MS);
  };
  live.hidden = lastNew === 0;
  setTimeout(poll, POLL_MS);
}
