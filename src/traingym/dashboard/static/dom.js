// DOM helpers. Every piece of text goes in as a text node (textContent), never as HTML:
// prompts, completions, tool output and run names are model- or user-written.

// el("tr", {class: "x", onclick: f, dataset: {sid: 3}}, child, "text", ...)
export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value === undefined || value === null || value === false) continue;
    if (key === "class") node.className = value;
    else if (key === "dataset") Object.assign(node.dataset, value);
    else if (key === "text") node.textContent = String(value);
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else if (key in node && typeof value !== "string") node[key] = value;
    else node.setAttribute(key, String(value));
  }
  append(node, children);
  return node;
}

export function append(node, children) {
  for (const child of children.flat()) {
    if (child === undefined || child === null || child === false) continue;
    node.appendChild(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

export function clear(node) {
  while (node.firstChild) node.removeChild(node.firstChild);
  return node;
}

export function fmt(value, digits = 4) {
  if (!(digits >= 1 && digits <= 21)) digits = 4;
  if (value === null || value === undefined) return "–";
  if (typeof value === "number") {
    if (!Number.isFinite(value)) return String(value);
    if (Number.isInteger(value)) return value.toLocaleString("en-US");
    const abs = Math.abs(value);
    if (abs !== 0 && (abs < 1e-3 || abs >= 1e6)) return value.toExponential(2);
    return String(Number(value.toPrecision(digits)));
  }
  if (typeof value === "object") return JSON.stringify(value);
  return String(value);
}

export function fmtBytes(n) {
  if (n === null || n === undefined) return "–";
  const units = ["B", "KB", "MB", "GB", "TB"];
  let i = 0;
  while (Math.abs(n) >= 1000 && i < units.length - 1) { n /= 1000; i++; }
  return `${Number(n.toPrecision(3))} ${units[i]}`;
}

export function fmtAge(seconds) {
  if (seconds === null || seconds === undefined) return "–";
  const s = Math.max(0, Math.round(seconds));
  if (s < 90) return `${s} s`;
  if (s < 5400) return `${Math.round(s / 60)} min`;
  if (s < 172800) return `${(s / 3600).toFixed(1)} h`;
  return `${Math.round(s / 86400)} d`;
}

// A key/value table of a flat or nested object (nested values shown as JSON text).
export function kvTable(obj, format = (v) => fmt(v)) {
  const rows = Object.entries(obj || {}).map(([k, v]) =>
    el("tr", {}, el("th", { text: k }), el("td", { text: format(v, k) })));
  return el("table", { class: "kv" }, el("tbody", {}, rows));
}

export function section(title, ...children) {
  return el("section", { class: "card" }, el("h2", { text: title }), ...children);
}

// The page's error line (an API error, a failed poll) and the breadcrumb trail.
export function showError(err) {
  const box = document.getElementById("error");
  box.textContent = String(err && err.message ? err.message : err);
  box.hidden = false;
  console.error(err);
}

export function setCrumbs(...parts) {
  const nav = clear(document.getElementById("crumbs"));
  for (const part of parts) {
    nav.appendChild(el("span", { class: "sep", text: "/" }));
    nav.appendChild(typeof part === "string" ? el("span", { text: part }) : part);
  }
}
