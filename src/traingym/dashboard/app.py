"""The FastAPI application: the JSON API of docs/dashboard.md (answers in api.py), the page
(static/index.html for `/`, `/run/{id}`, `/compare`) and its files (`/static/{name}`, by name
from the listing made at start), all behind security.Guard.

Every route answers GET and HEAD only. JSON is written with `<`, `>` and `&` escaped as
\\u003c, \\u003e, \\u0026 (still the same JSON; model-written text can never read as markup even
if an answer is opened directly), and non-finite floats (a NaN loss) as null.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from traingym.dashboard import api, security
from traingym.dashboard.index import FileChanged, SamplesIndex

GET = ["GET", "HEAD"]


def _clean(v):
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, dict):
        return {k: _clean(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_clean(x) for x in v]
    return v


def _dumps(content) -> bytes:
    try:
        text = json.dumps(content, allow_nan=False, separators=(",", ":"), default=str)
    except ValueError:  # NaN or infinity somewhere
        text = json.dumps(_clean(content), allow_nan=False, separators=(",", ":"), default=str)
    return (text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
            .encode())


def build_app(root: str | Path, token: str | None = None, hosts: set[str] | None = None,
              static: Path = api.STATIC):
    from fastapi import FastAPI, Query
    from fastapi.responses import JSONResponse, Response

    class Json(JSONResponse):
        def render(self, content) -> bytes:
            return _dumps(content)

    folders = api.Folders(Path(root))
    files = api.static_files(static)
    eval_samples: dict[str, SamplesIndex] = {}
    app = FastAPI(title="traingym dashboard", docs_url=None, redoc_url=None, openapi_url=None,
                  default_response_class=Json)

    def error(status: int, text: str):
        return Json({"detail": text}, status_code=status)

    app.exception_handler(api.NotFound)(lambda r, e: error(404, str(e)))
    app.exception_handler(api.BadRequest)(lambda r, e: error(400, str(e)))
    app.exception_handler(PermissionError)(lambda r, e: error(403, str(e)))
    app.exception_handler(FileChanged)(lambda r, e: error(409, str(e)))
    app.exception_handler(api.Unreadable)(lambda r, e: error(500, str(e)))
    app.exception_handler(Exception)(
        lambda r, e: error(500, f"internal error ({type(e).__name__}); see the server's log"))

    @app.api_route("/api/runs", methods=GET)
    def runs():
        listing = folders.listing()
        folders.forget_except(listing)
        return {"runs": [folders.run(ident).summary(ident)
                         for ident, (kind, _) in listing.items() if kind == "run"]}

    @app.api_route("/api/runs/{run_id}", methods=GET)
    def run(run_id: str):
        return api.detail(folders.run(run_id), run_id)

    @app.api_route("/api/runs/{run_id}/events", methods=GET)
    def events(run_id: str, after: int = -1, limit: int = Query(2000, ge=1, le=10000)):
        ev = folders.run(run_id).events
        with ev.lock:
            records = ev.after(after, limit)
            more = bool(records) and records[-1]["step"] < ev.last_step
        return {"events": records, "last": records[-1]["step"] if records else after,
                "more": more}

    @app.api_route("/api/runs/{run_id}/series", methods=GET)
    def series(run_id: str, keys: str = "reward_mean",
               max_points: int = Query(2000, ge=1, le=100000)):
        wanted = api._keys(keys)
        ev = folders.run(run_id).events
        with ev.lock:
            return ev.series(wanted, max_points)

    @app.api_route("/api/runs/{run_id}/samples", methods=GET)
    def samples(run_id: str, q: str = "", step: int | None = None,
                min_reward: float | None = None, max_reward: float | None = None,
                offset: int = Query(0, ge=0), limit: int = Query(50, ge=1, le=500),
                order: str = "desc"):
        index = folders.run(run_id).samples
        return api.query_samples(index, q, step, min_reward, max_reward, offset, limit, order)

    @app.api_route("/api/runs/{run_id}/samples/{sid}", methods=GET)
    def sample(run_id: str, sid: str):
        return api.one_sample(folders.run(run_id).samples, sid)

    @app.api_route("/api/runs/{run_id}/trace", methods=GET)
    def trace(run_id: str, max_events: int = Query(20000, ge=1, le=200000)):
        return api.trace_answer(folders.run(run_id), max_events)

    @app.api_route("/api/compare", methods=GET)
    def compare(runs: str, keys: str = "reward_mean",
                max_points: int = Query(2000, ge=1, le=100000)):
        ids, wanted = api._keys(runs, "runs"), api._keys(keys)
        if not ids:
            raise api.BadRequest("runs: give run ids separated by commas, e.g. runs=a,b")
        out = {}
        for ident in ids:
            ev = folders.run(ident).events
            with ev.lock:
                out[ident] = ev.series(wanted, max_points)
        return {"runs": out}

    @app.api_route("/api/evals", methods=GET)
    def evals():
        return {"evals": [api.eval_summary(i, p) for i, (kind, p) in folders.listing().items()
                          if kind == "eval"]}

    def eval_index(eval_id: str) -> SamplesIndex:
        path = folders.find("eval", eval_id)
        index = eval_samples.get(eval_id)
        if index is None or index.path != path / "samples.jsonl":
            index = eval_samples[eval_id] = SamplesIndex(path / "samples.jsonl")
        return index

    @app.api_route("/api/evals/{eval_id}", methods=GET)
    def eval_one(eval_id: str):
        path, index = folders.find("eval", eval_id), eval_index(eval_id)
        index.refresh()
        return {**api.eval_summary(eval_id, path), "samples_total": len(index),
                "summary": security.mask(api.read_json(path / "summary.json"))}

    @app.api_route("/api/evals/{eval_id}/samples", methods=GET)
    def eval_samples_query(eval_id: str, q: str = "", step: int | None = None,
                           min_reward: float | None = None, max_reward: float | None = None,
                           offset: int = Query(0, ge=0), limit: int = Query(50, ge=1, le=500),
                           order: str = "asc"):
        return api.query_samples(eval_index(eval_id), q, step, min_reward, max_reward, offset,
                                 limit, order)

    @app.api_route("/api/evals/{eval_id}/samples/{sid}", methods=GET)
    def eval_sample(eval_id: str, sid: str):
        return api.one_sample(eval_index(eval_id), sid)

    def page():
        if "index.html" not in files:
            raise api.NotFound("the page's files are missing (static/index.html); reinstall "
                               "traingym; the JSON API under /api/ works without them")
        return Response(files["index.html"].read_bytes(), media_type=api.TYPES[".html"])

    app.api_route("/", methods=GET)(page)
    app.api_route("/compare", methods=GET)(page)

    @app.api_route("/run/{run_id}", methods=GET)
    def run_page(run_id: str):
        if not api.ID_RE.fullmatch(run_id):
            raise api.NotFound(f"no run {run_id!r}")
        return page()

    @app.api_route("/static/{name:path}", methods=GET)
    def static_file(name: str):
        path = files.get(name)
        if path is None:
            raise api.NotFound(f"no file {name!r} among the page's files")
        kind = api.TYPES.get(path.suffix, "application/octet-stream")
        return Response(path.read_bytes(), media_type=kind)

    return security.Guard(app, hosts or security.allowed_hosts("127.0.0.1"), token)
