// Line charts over steps (uPlot, vendored: uplot.esm.js, MIT, see uplot.LICENSE).
// A Board holds one chart per spec and shows a chart only once one of its series has a value,
// so a run shows only the keys it records. Each chart's holder carries data-points (the number
// of steps drawn) and data-keys, which the browser tests read.

import uPlot from "/static/uplot.esm.js";
import { el, fmt, fmtBytes } from "/static/dom.js";

export const PALETTE = ["#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2",
  "#ca8a04", "#db2777", "#4b5563", "#65a30d"];

const ratio = (a, b) => (v) => (v(a) == null || !v(b) ? null : v(a) / v(b));

// One spec per chart: series are {key, label} (a key of events.jsonl) or {label, from, fn}
// (derived from other keys of the same record).
export const TRAINING_CHARTS = [
  { id: "reward", title: "Reward", series: [{ key: "reward_mean", label: "mean" },
    { key: "reward_std", label: "std" }] },
  { id: "loss", title: "Loss", series: [{ key: "loss", label: "loss" }] },
  { id: "kl", title: "KL to reference", series: [{ key: "kl", label: "kl" }] },
  { id: "entropy", title: "Entropy", series: [{ key: "entropy", label: "entropy" }] },
  { id: "lengths", title: "Completion length (tokens)", series: [
    { key: "completion_len_mean", label: "mean" }, { key: "completion_len_max", label: "max" }] },
  { id: "throughput", title: "Throughput (tokens/s)", series: [
    { key: "tokens_per_s", label: "trained tokens/s" },
    { key: "gen_tokens_per_s", label: "generated tokens/s" }] },
  { id: "staleness", title: "Staleness (policy versions)", series: [
    { key: "async_staleness_mean", label: "mean" }, { key: "async_staleness_max", label: "max" }] },
  { id: "mismatch_abs_logp", title: "Train/inference mismatch: mean |Δ log p|", series: [
    { key: "mismatch_abs_logp", label: "|Δ log p|" }] },
  { id: "mismatch_kl_k3", title: "Train/inference mismatch: KL (k3)", series: [
    { key: "mismatch_kl_k3", label: "KL k3" }] },
  { id: "seconds", title: "Seconds per step", series: [
    { key: "seconds_step", label: "step" }, { key: "seconds_rollout", label: "rollout" },
    { key: "seconds_train", label: "train" }, { key: "seconds_sync", label: "sync" }] },
  { id: "utilisation", title: "Busy fraction of the step", series: [
    { key: "util_trainer_busy", label: "trainer" }, { key: "util_engines_busy", label: "engines" }] },
  { id: "waits", title: "Waits (seconds per step)", series: [
    { key: "wait_trainer_on_rollout_s", label: "trainer on rollouts" },
    { key: "wait_engines_on_weights_s", label: "engines on weights" }] },
  { id: "grad_norm", title: "Gradient norm", series: [{ key: "grad_norm", label: "grad norm" }] },
  { id: "clip_frac", title: "Clipped fraction", series: [{ key: "clip_frac", label: "clip frac" }] },
];

export const SYNC_CHARTS = [
  { id: "sync_bytes", title: "Weight sync: bytes sent", format: fmtBytes, series: [
    { key: "sync_bytes", label: "sent" }, { key: "sync_full_bytes", label: "full" }] },
  { id: "sync_ratio", title: "Weight sync: sent / full", series: [
    { label: "ratio", from: ["sync_bytes", "sync_full_bytes"],
      fn: ratio("sync_bytes", "sync_full_bytes") }] },
  { id: "sync_seconds", title: "Weight sync: seconds", series: [
    { key: "seconds_sync", label: "total" }, { key: "sync_encode_s", label: "encode" },
    { key: "sync_send_s", label: "send" }, { key: "sync_apply_s", label: "apply" },
    { key: "sync_engine_s", label: "engine" }, { key: "sync_publish_s", label: "publish" }] },
];

// Sandboxes and environments (docs/observability.md, "Trace and utilisation"); any other
// numeric key starting with SANDBOX_PREFIX gets a chart of its own (run.js).
export const SANDBOX_CHARTS = [
  { id: "sandbox_wait", title: "Sandbox queue wait (seconds per step)", series: [
    { key: "wait_sandbox_queue_s", label: "warm-pool wait" }] },
  { id: "env_seconds", title: "Environment calls (seconds per step, summed)", series: [
    { key: "util_env_s", label: "env calls" }] },
];

export const SANDBOX_PREFIX = "sandbox_";

// Every raw key the specs read.
export function specKeys(specs) {
  const keys = new Set();
  for (const spec of specs) for (const s of spec.series) (s.from || [s.key]).forEach((k) => keys.add(k));
  return [...keys];
}

function number(v) {
  return typeof v === "number" && Number.isFinite(v) ? v : null;
}

function seriesValue(s, get) {
  return number(s.fn ? s.fn(get) : get(s.key));
}

// a flat series (a KL of 0) gets a band around its value (0: 0..1), not uPlot's 0..100
function flatRange(u, min, max) {
  if (min !== max) return uPlot.rangeNum(min, max, 0.1, true);
  if (min === 0) return [0, 1];
  const pad = Math.abs(min) * 0.5;
  return [min - pad, max + pad];
}

// the y axis as wide as its longest tick label
function axisWidth(u, values) {
  const longest = Math.max(0, ...(values || []).map((v) => String(v).length));
  return Math.max(40, longest * 7 + 18);
}

function chartOptions(spec, width, labels, colors) {
  const format = spec.format || ((v) => fmt(v, 3));
  return {
    width, height: 220,
    legend: { live: true },
    cursor: { drag: { x: true, y: false } },
    scales: { x: { time: false }, y: { range: flatRange } },
    axes: [
      { label: "step", grid: { stroke: "#eee" } },
      { grid: { stroke: "#eee" }, size: axisWidth, values: (u, ticks) => ticks.map((t) => format(t)) },
    ],
    series: [{ label: "step" }, ...labels.map((label, i) => ({
      label, stroke: colors[i % colors.length], width: 1.5, spanGaps: true,
      points: { show: false }, value: (u, v) => format(v),
    }))],
  };
}

// One uPlot chart whose data grows by push(); flush() redraws.
export class LineChart {
  constructor(holder, spec, labels, data, colors = PALETTE) {
    this.holder = holder;
    this.data = data;
    this.dirty = false;
    holder.dataset.keys = spec.series.map((s) => s.key || s.label).join(",");
    this.plot = new uPlot(chartOptions(spec, this.width(), labels, colors), data, holder);
    this.mark();
  }
  width() { return Math.max(280, (this.holder.clientWidth || 480) - 8); }
  mark() {
    this.holder.dataset.points = String(this.data[0].length);
    this.dirty = false;
  }
  push(x, ys) {
    const xs = this.data[0];
    if (xs.length && x <= xs[xs.length - 1]) return; // a step already drawn (resume rewrites)
    xs.push(x);
    ys.forEach((y, i) => this.data[i + 1].push(y));
    this.dirty = true;
  }
  flush() {
    if (!this.dirty) return;
    this.plot.setData(this.data);
    this.mark();
  }
  resize() { this.plot.setSize({ width: this.width(), height: 220 }); }
}

// Charts of one run: created from a downsampled series, then grown from new event records.
export class Board {
  constructor(container, specs) {
    this.specs = specs;
    this.charts = new Map();
    this.holders = new Map();
    for (const spec of specs) {
      const holder = el("div", { class: "chart", dataset: { chart: spec.id } });
      const card = el("figure", { class: "chart-card", hidden: true },
        el("figcaption", { text: spec.title }), holder);
      container.appendChild(card);
      this.holders.set(spec.id, { card, holder });
    }
    new ResizeObserver(() => this.resize()).observe(container);
  }
  get shown() { return this.charts.size; }
  ensure(spec) {
    let chart = this.charts.get(spec.id);
    if (!chart) {
      const { card, holder } = this.holders.get(spec.id);
      card.hidden = false;
      chart = new LineChart(holder, spec, spec.series.map((s) => s.label),
        [[], ...spec.series.map(() => [])]);
      this.charts.set(spec.id, chart);
    }
    return chart;
  }
  // series: {"step": [...], key: [...]} from /api/runs/{id}/series.
  load(series) {
    const steps = series.step || [];
    for (const spec of this.specs) {
      for (let i = 0; i < steps.length; i++) {
        const ys = spec.series.map((s) => seriesValue(s, (k) => (series[k] || [])[i]));
        if (ys.some((y) => y !== null)) this.ensure(spec).push(steps[i], ys);
      }
    }
    this.flush();
  }
  append(records) {
    for (const rec of records) {
      if (typeof rec.step !== "number") continue;
      for (const spec of this.specs) {
        const ys = spec.series.map((s) => seriesValue(s, (k) => rec[k]));
        if (ys.some((y) => y !== null)) this.ensure(spec).push(rec.step, ys);
      }
    }
    this.flush();
  }
  flush() { for (const chart of this.charts.values()) chart.flush(); }
  resize() { for (const chart of this.charts.values()) chart.resize(); }
}

// Several runs' series overlaid on one chart per key:
// tables = [{label, color, step: [], values: []}] (a run keeps its colour on every chart).
export function overlayChart(container, title, tables, format) {
  const holder = el("div", { class: "chart", dataset: { chart: title } });
  container.appendChild(el("figure", { class: "chart-card" }, el("figcaption", { text: title }), holder));
  const data = uPlot.join(tables.map((t) => [t.step, t.values]));
  const spec = { format, series: tables.map((t) => ({ label: t.label })) };
  const chart = new LineChart(holder, spec, tables.map((t) => t.label), data,
    tables.map((t) => t.color));
  new ResizeObserver(() => chart.resize()).observe(holder);
  return chart;
}
