// The timeline from trace.json: one row per (process, thread), each span a bar coloured by its
// category, drawn on a canvas. Zoom with the range controls (or the mouse wheel over the
// canvas), pan with the position control; hovering a bar names it. The canvas carries
// data-spans (spans loaded) and data-drawn (bars drawn in the current window) for the tests.
// Span names reach the page only through canvas fillText and textContent.

import { api } from "/static/api.js";
import { el, clear, fmt, kvTable } from "/static/dom.js";
import { PALETTE } from "/static/charts.js";

const ROW_H = 22;
const GUTTER = 260;
const AXIS_H = 24;

function processNames(processes) {
  const names = new Map();
  for (const p of Array.isArray(processes) ? processes : Object.entries(processes || {}).map(
    ([pid, v]) => (typeof v === "object" ? { pid, ...v } : { pid, name: v }))) {
    if (p && p.pid !== undefined) names.set(String(p.pid), p);
  }
  return names;
}

function threadLabel(proc, pid, tid) {
  const threads = proc && proc.threads;
  const tname = threads && (Array.isArray(threads)
    ? (threads.find((t) => String(t.tid) === String(tid)) || {}).name : threads[tid]);
  return `${(proc && proc.name) || `pid ${pid}`} · ${tname || `tid ${tid}`}`;
}

// `text` cut with an ellipsis to fit `width` pixels
function fitText(ctx, text, width) {
  if (ctx.measureText(text).width <= width) return text;
  let n = text.length;
  while (n > 1 && ctx.measureText(`${text.slice(0, n)}…`).width > width) n--;
  return `${text.slice(0, n)}…`;
}

function niceStep(span) {
  const raw = span / 8;
  const p = 10 ** Math.floor(Math.log10(raw));
  return [1, 2, 5, 10].map((m) => m * p).find((s) => s >= raw);
}

function fmtMicros(us) {
  if (Math.abs(us) >= 1e6) return `${fmt(us / 1e6, 4)} s`;
  if (Math.abs(us) >= 1e3) return `${fmt(us / 1e3, 4)} ms`;
  return `${fmt(us, 4)} µs`;
}

function gridOf(rows, firstHeader) {
  const cols = [...new Set(rows.flatMap(([, v]) => Object.keys(v)))];
  const cell = (v) => (v && typeof v === "object"
    ? Object.entries(v).map(([k, x]) => `${k} ${fmt(x, 3)}`).join(", ") : fmt(v, 3));
  return el("table", { class: "grid" },
    el("thead", {}, el("tr", {}, el("th", { text: firstHeader }), cols.map((c) => el("th", { text: c })))),
    el("tbody", {}, rows.map(([name, v]) => el("tr", {}, el("th", { text: name }),
      cols.map((c) => el("td", { class: typeof v[c] === "number" ? "num" : "", text: cell(v[c]) }))))));
}

// results.json's {wall_s, processes: {name: {busy_s, idle_s, busy_frac, waits}}, ...}, or the
// server's per-process {name: {busy_s, wall_s, busy_frac}} from the spans of a live run
function utilisationView(util) {
  const entries = Object.entries(util || {});
  if (!entries.length) return null;
  const isRow = ([, v]) => v && typeof v === "object" && !Array.isArray(v);
  const procs = util.processes && typeof util.processes === "object" ? Object.entries(util.processes)
    : entries.every(isRow) ? entries : [];
  const scalars = Object.fromEntries(entries.filter(([k, v]) => k !== "processes" && !isRow([k, v])));
  return el("div", { id: "utilisation" }, procs.length ? gridOf(procs, "process") : null,
    Object.keys(scalars).length ? kvTable(scalars) : null);
}

export async function timelineView(pane, id) {
  const trace = await api.trace(id);
  // (the server keeps the latest max_events spans; api.js asks for 50000)
  const spans = (trace.spans || []).filter((s) => typeof s.ts === "number");
  if (!spans.length) {
    pane.appendChild(el("p", { class: "muted", id: "timeline-empty",
      text: "No trace for this run (trace.json is written when observability.trace is on)." }));
    return;
  }
  const procs = processNames(trace.processes);
  const rowKey = (s) => `${s.pid}\u0000${s.tid}`;
  // rows in the server's process order (sort index, then name), threads by id within one
  const order = new Map([...procs.keys()].map((pid, i) => [pid, i]));
  const rows = [...new Set(spans.map(rowKey))].sort((a, b) => {
    const [pa, ta] = a.split("\u0000"); const [pb, tb] = b.split("\u0000");
    return ((order.get(pa) ?? 1e9) - (order.get(pb) ?? 1e9)) || pa.localeCompare(pb)
      || (Number(ta) - Number(tb)) || ta.localeCompare(tb);
  });
  const rowIndex = new Map(rows.map((r, i) => [r, i]));
  const labels = rows.map((r) => { const [pid, tid] = r.split("\u0000"); return threadLabel(procs.get(pid), pid, tid); });
  const cats = [...new Set(spans.map((s) => s.cat || ""))].sort();
  const color = (cat) => PALETTE[cats.indexOf(cat || "") % PALETTE.length];
  let t0 = Infinity;
  let t1 = -Infinity;
  for (const s of spans) { t0 = Math.min(t0, s.ts); t1 = Math.max(t1, s.ts + (s.dur || 0)); }
  const total = Math.max(t1 - t0, 1);

  const zoom = el("input", { type: "range", min: 0, max: 1000, value: 0, id: "timeline-zoom", "aria-label": "zoom" });
  const pos = el("input", { type: "range", min: 0, max: 1000, value: 0, id: "timeline-pos", "aria-label": "position" });
  const windowLabel = el("span", { class: "muted" });
  const reset = el("button", { type: "button", text: "reset" });
  const legend = el("div", { class: "legend" }, cats.map((c) =>
    el("span", { class: "cat" }, el("i", { class: "swatch", dataset: { color: color(c) } }), c || "(no category)")));
  legend.querySelectorAll(".swatch").forEach((s) => { s.style.background = s.dataset.color; });
  const canvas = el("canvas", { id: "timeline", dataset: { spans: spans.length } });
  const tip = el("div", { class: "tip", hidden: true });
  const wrap = el("div", { class: "timeline-wrap" }, canvas, tip);
  pane.append(el("div", { class: "filters" }, el("label", {}, "zoom ", zoom), el("label", {}, "position ", pos),
    reset, windowLabel), legend, wrap);
  const util = utilisationView(trace.utilisation);
  if (util) pane.append(el("h3", { text: "Utilisation" }), util);
  if (trace.truncated) pane.append(el("p", { class: "muted", text: `Showing the first ${spans.length} spans.` }));

  const view = () => {
    const factor = 1000 ** (Number(zoom.value) / 1000); // 1x .. 1000x
    const width = total / factor;
    const start = t0 + (total - width) * (Number(pos.value) / 1000);
    return { start, width };
  };
  let drawnBars = [];
  const draw = () => {
    const cssW = Math.max(400, wrap.clientWidth || 900);
    const cssH = rows.length * ROW_H + AXIS_H;
    const dpr = window.devicePixelRatio || 1;
    canvas.width = cssW * dpr; canvas.height = cssH * dpr;
    canvas.style.width = `${cssW}px`; canvas.style.height = `${cssH}px`;
    const ctx = canvas.getContext("2d");
    ctx.scale(dpr, dpr);
    ctx.clearRect(0, 0, cssW, cssH);
    ctx.font = "12px system-ui, sans-serif";
    ctx.textBaseline = "middle";
    const { start, width } = view();
    const plotW = cssW - GUTTER;
    const x = (t) => GUTTER + ((t - start) / width) * plotW;
    rows.forEach((r, i) => {
      ctx.fillStyle = i % 2 ? "#f8fafc" : "#ffffff";
      ctx.fillRect(0, AXIS_H + i * ROW_H, cssW, ROW_H);
      ctx.fillStyle = "#111827";
      ctx.fillText(fitText(ctx, labels[i], GUTTER - 12), 6, AXIS_H + i * ROW_H + ROW_H / 2);
    });
    const step = niceStep(width);
    ctx.fillStyle = "#6b7280"; ctx.strokeStyle = "#e5e7eb";
    for (let t = Math.ceil((start - t0) / step) * step; t <= start - t0 + width; t += step) {
      const px = x(t0 + t);
      ctx.beginPath(); ctx.moveTo(px, AXIS_H - 4); ctx.lineTo(px, cssH); ctx.stroke();
      ctx.fillText(fmtMicros(t), px + 3, AXIS_H / 2);
    }
    drawnBars = [];
    ctx.save();
    ctx.beginPath(); ctx.rect(GUTTER, AXIS_H, plotW, cssH - AXIS_H); ctx.clip();
    for (const s of spans) {
      const end = s.ts + (s.dur || 0);
      if (end < start || s.ts > start + width) continue;
      const bx = x(s.ts);
      const bw = Math.max(1, x(end) - bx);
      const by = AXIS_H + rowIndex.get(rowKey(s)) * ROW_H + 3;
      ctx.fillStyle = color(s.cat);
      ctx.fillRect(bx, by, bw, ROW_H - 6);
      if (bw > 40) {
        ctx.fillStyle = "#ffffff";
        ctx.fillText(fitText(ctx, String(s.name), bw - 6), Math.max(bx, GUTTER) + 3, by + (ROW_H - 6) / 2);
      }
      drawnBars.push({ s, bx, bw, by });
    }
    ctx.restore();
    canvas.dataset.drawn = String(drawnBars.length);
    windowLabel.textContent = `${fmtMicros(start - t0)} – ${fmtMicros(start - t0 + width)} of ${fmtMicros(total)}`;
  };
  zoom.addEventListener("input", draw);
  pos.addEventListener("input", draw);
  reset.addEventListener("click", () => { zoom.value = 0; pos.value = 0; draw(); });
  canvas.addEventListener("wheel", (e) => {
    e.preventDefault();
    const rect = canvas.getBoundingClientRect();
    const { start, width } = view();
    const at = start + ((e.clientX - rect.left - GUTTER) / (rect.width - GUTTER)) * width;
    zoom.value = String(Math.min(1000, Math.max(0, Number(zoom.value) - Math.sign(e.deltaY) * 50)));
    const w = view().width;
    const frac = total - w > 0 ? (Math.min(Math.max(at - (at - start) * (w / width), t0), t1 - w) - t0) / (total - w) : 0;
    pos.value = String(Math.round(frac * 1000));
    draw();
  }, { passive: false });
  canvas.addEventListener("mousemove", (e) => {
    const rect = canvas.getBoundingClientRect();
    const mx = e.clientX - rect.left; const my = e.clientY - rect.top;
    const hit = drawnBars.find((b) => mx >= b.bx && mx <= b.bx + b.bw && my >= b.by && my <= b.by + ROW_H - 6);
    tip.hidden = !hit;
    if (hit) {
      clear(tip).append(el("strong", { text: hit.s.name }), el("br"),
        `${hit.s.cat || ""} · ${fmtMicros(hit.s.dur || 0)} · pid ${hit.s.pid} tid ${hit.s.tid}`);
      tip.style.left = `${Math.min(mx + 12, rect.width - 260)}px`;
      tip.style.top = `${my + 12}px`;
    }
  });
  canvas.addEventListener("mouseleave", () => { tip.hidden = true; });
  new ResizeObserver(draw).observe(wrap);
  draw();
}
