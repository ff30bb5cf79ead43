// The dashboard's JSON API (docs/dashboard.md). Same origin only; the token cookie, when the
// server asks for one, goes along by default.

export class ApiError extends Error {}

export async function getJSON(path, params = {}) {
  const query = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) {
    if (v !== undefined && v !== null && v !== "") query.set(k, String(v));
  }
  const qs = query.toString();
  const url = qs ? `${path}?${qs}` : path;
  const response = await fetch(url, { headers: { Accept: "application/json" } });
  if (!response.ok) {
    let detail = response.statusText;
    try { detail = (await response.json()).detail ?? detail; } catch { /* not JSON */ }
    throw new ApiError(`${url}: ${response.status} ${typeof detail === "string" ? detail : JSON.stringify(detail)}`);
  }
  return response.json();
}

const enc = encodeURIComponent;

export const api = {
  runs: () => getJSON("/api/runs"),
  run: (id) => getJSON(`/api/runs/${enc(id)}`),
  events: (id, after) => getJSON(`/api/runs/${enc(id)}/events`, { after }),
  series: (id, keys, maxPoints = 2000) =>
    getJSON(`/api/runs/${enc(id)}/series`, { keys: keys.join(","), max_points: maxPoints }),
  samples: (id, filters) => getJSON(`/api/runs/${enc(id)}/samples`, filters),
  sample: (id, sid) => getJSON(`/api/runs/${enc(id)}/samples/${enc(sid)}`),
  trace: (id, maxEvents = 50000) => getJSON(`/api/runs/${enc(id)}/trace`, { max_events: maxEvents }),
  compare: (ids, keys) => getJSON("/api/compare", { runs: ids.join(","), keys: keys.join(",") }),
  evals: () => getJSON("/api/evals"),
  evalOne: (id) => getJSON(`/api/evals/${enc(id)}`),
};
