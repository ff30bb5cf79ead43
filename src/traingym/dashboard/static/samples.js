// The samples browser: a table (step, reward, prompt and completion excerpts) with a search box
// and step / reward filters, paged by the server; a row opens the full sample: prompt,
// completion, reward, step, environment turns, tool calls and sandbox results when present.
// Everything from the sample goes in as text (dom.js), never as HTML.

import { api } from "/static/api.js";
import { el, clear, fmt, kvTable, showError } from "/static/dom.js";

const PAGE = 50;

// one line: whitespace runs (a chat template's newlines) collapsed
function excerpt(text, n = 140) {
  const s = String(text ?? "").replace(/\s+/g, " ").trim();
  return s.length > n ? `${s.slice(0, n)}…` : s;
}

function pre(text, cls = "text") {
  return el("pre", { class: cls, text: typeof text === "string" ? text : JSON.stringify(text, null, 2) });
}

function block(title, ...children) {
  return el("div", { class: "block" }, el("h3", { text: title }), ...children);
}

const asList = (v) => (Array.isArray(v) ? v : v && typeof v === "object" ? [v] : []);

// A turn/message: {role, content, tool_calls?, ...} or a plain string.
function turnView(turn, i) {
  if (typeof turn !== "object" || turn === null) return el("div", { class: "turn" }, pre(turn));
  const role = turn.role || turn.kind || `turn ${i + 1}`;
  const body = turn.content ?? turn.text ?? turn.observation ?? turn.completion;
  const rest = Object.fromEntries(Object.entries(turn).filter(([k]) =>
    !["role", "kind", "content", "text", "observation", "completion"].includes(k)));
  return el("div", { class: `turn role-${String(role).replace(/[^a-z_-]/gi, "")}` },
    el("div", { class: "role", text: role }),
    body !== undefined ? pre(body) : null,
    Object.keys(rest).length ? pre(rest, "meta") : null);
}

function toolView(call) {
  if (typeof call !== "object" || call === null) return pre(call);
  // samples.jsonl: {turn, name, arguments} or {turn, error} (a malformed call)
  const fn = call.function || {};
  const name = call.name || fn.name || call.tool || (call.error ? "malformed call" : "tool call");
  const args = call.arguments ?? fn.arguments ?? call.args ?? call.input;
  const result = call.result ?? call.output ?? call.response;
  const where = call.turn !== undefined ? ` (policy turn ${call.turn})` : "";
  return el("div", { class: "tool" }, el("div", { class: "role", text: name + where }),
    args !== undefined ? pre(args, "meta") : null, result !== undefined ? pre(result) : null,
    call.error !== undefined ? pre(call.error, "text failed") : null);
}

function execView(r) {
  if (typeof r !== "object" || r === null) return pre(r);
  const scalars = Object.fromEntries(Object.entries(r).filter(([, v]) => typeof v !== "object" && !(
    typeof v === "string" && v.length > 80)));
  const texts = Object.entries(r).filter(([k, v]) => !(k in scalars) && v !== null);
  return el("div", { class: "exec" }, kvTable(scalars),
    texts.map(([k, v]) => el("div", {}, el("div", { class: "role", text: k }), pre(v))));
}

const SHOWN = new Set(["sid", "step", "reward", "prompt", "completion", "turns", "messages",
  "tool_calls", "tools", "env_info", "sandbox", "sandbox_results", "exec_results"]);

export function sampleDetail(rec) {
  const turns = asList(rec.messages ?? (Array.isArray(rec.turns) ? rec.turns : null));
  const tools = asList(rec.tool_calls ?? rec.tools);
  // env_info: per environment step, the JSON-safe part of StepResult.info (a code env's
  // sandbox verdict: status, details)
  const execs = asList(rec.env_info ?? rec.sandbox_results ?? rec.sandbox ?? rec.exec_results);
  const other = Object.fromEntries(Object.entries(rec).filter(([k]) => !SHOWN.has(k)));
  if (typeof rec.turns === "number") other.turns = rec.turns;
  return el("div", { class: "sample", id: "sample-detail", dataset: { sid: rec.sid } },
    el("p", { class: "sample-head" }, el("strong", { text: `sample ${fmt(rec.sid)}` }),
      ` · step ${fmt(rec.step)} · reward `, el("span", { class: "reward", text: fmt(rec.reward) })),
    block("Prompt", pre(rec.prompt ?? "")),
    block("Completion", pre(rec.completion ?? "", "text completion")),
    turns.length ? block(`Turns, policy and environment (${turns.length})`, turns.map(turnView)) : null,
    tools.length ? block(`Tool calls (${tools.length})`, tools.map(toolView)) : null,
    execs.length ? block(`Environment and sandbox results (${execs.length})`, execs.map(execView)) : null,
    Object.keys(other).length ? block("Other fields", pre(other, "meta")) : null);
}

export async function samplesView(pane, id) {
  const q = el("input", { type: "search", name: "q", placeholder: "search prompt or completion", size: 32 });
  const step = el("input", { type: "number", name: "step", placeholder: "step", min: 0, class: "short" });
  const minR = el("input", { type: "number", name: "min_reward", placeholder: "min reward", step: "any", class: "short" });
  const maxR = el("input", { type: "number", name: "max_reward", placeholder: "max reward", step: "any", class: "short" });
  const info = el("span", { class: "muted", id: "samples-total" });
  const prev = el("button", { type: "button", text: "‹ prev" });
  const next = el("button", { type: "button", text: "next ›" });
  const form = el("form", { class: "filters" }, q, step, minR, maxR,
    el("button", { type: "submit", text: "Search" }), prev, next, info);
  const body = el("tbody");
  const table = el("table", { class: "grid samples", id: "samples" },
    el("thead", {}, el("tr", {}, ["sid", "step", "reward", "prompt", "completion"].map((h) => el("th", { text: h })))),
    body);
  const detail = el("div", { class: "detail", id: "sample-pane" },
    el("p", { class: "muted", text: "Click a sample to see it in full." }));
  pane.append(form, el("div", { class: "split" }, el("div", { class: "list" }, table), detail));

  let offset = 0;
  let total = 0;
  const open = async (sid, row) => {
    body.querySelectorAll("tr.selected").forEach((r) => r.classList.remove("selected"));
    row.classList.add("selected");
    const rec = await api.sample(id, sid);
    clear(detail).appendChild(sampleDetail(rec));
  };
  const load = async () => {
    const res = await api.samples(id, { q: q.value, step: step.value, min_reward: minR.value,
      max_reward: maxR.value, offset, limit: PAGE });
    total = res.total;
    clear(body);
    for (const item of res.items) {
      const row = el("tr", { dataset: { sid: item.sid }, tabindex: 0 },
        el("td", { class: "num", text: fmt(item.sid) }), el("td", { class: "num", text: fmt(item.step) }),
        el("td", { class: "num", text: fmt(item.reward, 3) }),
        el("td", { class: "excerpt", text: excerpt(item.prompt) }),
        el("td", { class: "excerpt", text: excerpt(item.completion) }));
      row.addEventListener("click", () => open(item.sid, row).catch(showError));
      row.addEventListener("keydown", (e) => e.key === "Enter" && open(item.sid, row).catch(showError));
      body.appendChild(row);
    }
    info.textContent = total ? `${fmt(offset + 1)}–${fmt(offset + res.items.length)} of ${fmt(total)}` : "no samples match";
    prev.disabled = offset === 0;
    next.disabled = offset + PAGE >= total;
  };
  form.addEventListener("submit", (e) => { e.preventDefault(); offset = 0; load().catch(showError); });
  prev.addEventListener("click", () => { offset = Math.max(0, offset - PAGE); load().catch(showError); });
  next.addEventListener("click", () => { offset += PAGE; load().catch(showError); });
  await load();
}
