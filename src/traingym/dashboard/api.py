"""What the dashboard's JSON API answers (docs/dashboard.md) over RUNS_DIR; dashboard/app.py maps
routes to these functions.

Ids, never paths: a run or eval id must match `[A-Za-z0-9][A-Za-z0-9._-]*`, name a non-symlink
folder directly under RUNS_DIR, and the files read in it are fixed names and plain files, so
nothing outside RUNS_DIR is read. Each run keeps an incremental index (dashboard/index.py)
refreshed per request, so a live run's new steps show on the next poll; status comes from
runs/index.py RunView.
"""

from __future__ import annotations

import json
import math
import re
import threading
import time
from pathlib import Path

from traingym.core import trace as tr
from traingym.dashboard import security
from traingym.dashboard.index import SID_RE, EventsIndex, SamplesIndex
from traingym.runs.index import RunView, committed, is_run_dir

ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}")
KEY_RE = re.compile(r"[A-Za-z0-9_.:/@-]{1,200}")
STATIC = Path(__file__).parent / "static"
TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
         ".mjs": "text/javascript; charset=utf-8", ".css": "text/css; charset=utf-8",
         ".svg": "image/svg+xml", ".png": "image/png", ".ico": "image/x-icon",
         ".json": "application/json", ".woff2": "font/woff2", ".txt": "text/plain; charset=utf-8",
         ".map": "application/json"}
PREVIEW = 300  # characters of prompt and completion in a samples listing


class NotFound(Exception):
    pass


class BadRequest(Exception):
    pass


class Unreadable(Exception):
    """A file of the run that exists but cannot be read as its format says (a damaged trace
    shard); the message names it."""


def static_files(folder: Path = STATIC) -> dict[str, Path]:
    """{name: path} of the plain files under `folder` (names are relative, '/'-separated)."""
    if not folder.is_dir():
        return {}
    return {p.relative_to(folder).as_posix(): p for p in sorted(folder.rglob("*"))
            if p.is_file() and not p.is_symlink()
            and not any(part.startswith(".") for part in p.relative_to(folder).parts)}


def plain_file(path: Path) -> bool:
    return path.is_file() and not path.is_symlink()


def read_json(path: Path):
    if not plain_file(path):
        return None
    try:
        return json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError):
        return None  # being rewritten (results.json is written last) or damaged


class _View(RunView):
    """RunView whose steps come from the index (RunView reads all of events.jsonl)."""

    def __init__(self, path: Path, last_step: int):
        self.path, self._last = path, last_step

    @property
    def steps_done(self) -> int:
        return self._last


class Run:
    def __init__(self, path: Path):
        self.path = path
        self.events = EventsIndex(path / "events.jsonl")
        self.samples = SamplesIndex(path / "samples.jsonl")
        self.trace_lock = threading.Lock()
        self.trace_key, self.trace = None, None

    def refresh(self) -> "Run":
        self.events.refresh()
        return self

    def view(self) -> _View:
        return _View(self.path, self.events.last_step)

    def summary(self, run_id: str) -> dict:
        view, cfg = self.view(), read_json(self.path / "config.json") or {}
        report = (read_json(self.path / "results.json") or {}).get("eval") or {}
        delta = (report.get("delta") or {}).get(report.get("target_metric"))
        change = {"metric": report["target_metric"], **delta} if isinstance(delta, dict) else None
        mtimes = [p.stat().st_mtime for p in (self.path / "events.jsonl",
                                               self.path / "config.json") if p.exists()]
        return {"id": run_id, "status": view.status, "step": self.events.last_step,
                "steps": cfg.get("steps"), "reward": self.events.last("reward_mean"),
                "heldout_change": change,
                "age_s": round(time.time() - max(mtimes), 3) if mtimes else None,
                "mode": cfg.get("mode"), "engine": (cfg.get("rollout") or {}).get("engine"),
                "algorithm": (cfg.get("algorithm") or {}).get("name")}


class Folders:
    """The runs and eval folders directly under `root`, listed afresh on each request."""

    def __init__(self, root: Path):
        self.root = root.resolve()
        self.runs: dict[str, Run] = {}
        self.lock = threading.Lock()

    def listing(self) -> dict[str, tuple[str, Path]]:
        if is_run_dir(self.root):
            return {self.root.name: ("run", self.root)} if ID_RE.fullmatch(self.root.name) \
                else {}
        out = {}
        for p in sorted(self.root.iterdir()):
            if not ID_RE.fullmatch(p.name) or ".." in p.name or p.is_symlink() or not p.is_dir():
                continue
            if plain_file(p / "config.json") and is_run_dir(p):
                out[p.name] = ("run", p)
            elif plain_file(p / "summary.json"):
                out[p.name] = ("eval", p)
        return out

    def find(self, kind: str, ident: str) -> Path:
        if not ID_RE.fullmatch(ident) or ".." in ident:
            raise NotFound(f"no {kind} {ident!r}")
        found = self.listing().get(ident)
        if found is None or found[0] != kind:
            raise NotFound(f"no {kind} {ident!r} in the runs folder")
        return found[1]

    def forget_except(self, listing: dict) -> None:
        """Drop the indexes of runs no longer listed (deleted or renamed folders)."""
        with self.lock:
            for ident in [i for i in self.runs if i not in listing]:
                del self.runs[ident]

    def run(self, ident: str) -> Run:
        path = self.find("run", ident)
        with self.lock:
            run = self.runs.get(ident)
            if run is None or run.path != path:
                run = self.runs[ident] = Run(path)
        return run.refresh()


def _keys(text: str, what: str = "keys") -> list[str]:
    keys = [k for k in text.split(",") if k]
    bad = [k for k in keys if not KEY_RE.fullmatch(k)]
    if bad or len(keys) > 64:
        raise BadRequest(f"{what}: give at most 64 comma-separated names of letters, digits and "
                         f"_.:/@- (bad: {bad[:3]})")
    return keys


def detail(run: Run, run_id: str) -> dict:
    ev, path = run.events, run.path
    cfg = read_json(path / "config.json") or {}
    with ev.lock:  # the per-key sums are extended here
        numeric = sorted(k for k, col in ev.columns.items()
                         if any(isinstance(v, (int, float)) and not isinstance(v, bool)
                                for v in col[-50:]))
        stats = {"sync": sync_stats(ev), "sandbox": sandbox_stats(ev)}
    run.samples.refresh()
    with run.samples.lock:
        stats.update(sandbox_verdicts=dict(run.samples.verdicts),
                     bad_lines={"events": ev.bad_lines, "samples": run.samples.bad_lines})
    return {**run.summary(run_id), "config": security.mask(cfg),
            "results": security.mask(read_json(path / "results.json")),
            "eval_before": security.mask(read_json(path / "eval_before.json")),
            "eval_after": security.mask(read_json(path / "eval_after.json")),
            "checkpoints": [int(p.name.removeprefix("step_")) for p in
                            committed(path / "checkpoints") if p.name[5:].isdigit()],
            "keys": numeric, **stats}


def sync_stats(ev: EventsIndex) -> dict:
    """Weight sync over the run: bytes sent vs full size, seconds per phase, codecs used."""
    (sent, syncs), (full, _) = ev.total("sync_bytes"), ev.total("sync_full_bytes")
    codecs: dict[str, int] = {}
    for v in ev.columns.get("sync_codec", ()):
        if isinstance(v, str):
            codecs[v] = codecs.get(v, 0) + 1
    seconds = {k: _mean(*ev.total(k)) for k in sorted(ev.columns)
               if k.startswith("sync_") and k.endswith("_s")}
    return {"syncs": syncs, "bytes_total": _int(sent), "full_bytes_total": _int(full),
            "ratio": sent / full if full else None, "seconds_mean": seconds,
            "codecs": codecs, "last": {k: ev.last(k) for k in sorted(ev.columns)
                                       if k.startswith("sync_")}}


SANDBOX_KEYS = ("wait_sandbox_queue_s", "util_env_s")  # observability/utilisation.py


def sandbox_stats(ev: EventsIndex) -> dict:
    """{key: {'last', 'mean', 'max', 'total'}} of the sandbox and environment keys: the queue
    wait for a warm sandbox, seconds in environment calls, and any `sandbox_*` key."""
    out = {}
    for k in sorted(ev.columns):
        if (k in SANDBOX_KEYS or k.startswith("sandbox_")) and (t := ev.total(k))[1]:
            out[k] = {"last": ev.last(k), "mean": _mean(*t), "max": ev.maximum(k),
                      "total": t[0]}
    return out


def _int(x: float):
    return int(x) if x.is_integer() else x


def _mean(total: float, count: int):
    return total / count if count else None


def sample_item(rec: dict, sid: str) -> dict:
    def cut(v):
        v = v if isinstance(v, str) or v is None else json.dumps(v)
        return v[:PREVIEW] if v is not None else None
    return {"sid": sid, "step": rec.get("step"), "reward": rec.get("reward"),
            "prompt": cut(rec.get("prompt")), "completion": cut(rec.get("completion"))}


def query_samples(index: SamplesIndex, q: str, step, min_reward, max_reward, offset: int,
                  limit: int, order: str) -> dict:
    if order not in ("desc", "asc"):
        raise BadRequest("order: 'desc' (newest first, the default) or 'asc'")
    for name, v in (("min_reward", min_reward), ("max_reward", max_reward)):
        if v is not None and not math.isfinite(v):
            raise BadRequest(f"{name} must be a finite number")
    if len(q) > 1000:
        raise BadRequest("q: at most 1000 characters")
    index.refresh()
    with index.lock:
        total, page = index.query(q, step, min_reward, max_reward, offset, limit,
                                  newest_first=order == "desc")
        records = index.read_many(page)
        sids = [index.sids[i] for i in page]
    return {"total": total, "offset": offset, "items": [sample_item(r, s)
                                                         for r, s in zip(records, sids)]}


def one_sample(index: SamplesIndex, sid: str) -> dict:
    if not SID_RE.fullmatch(sid):
        raise NotFound(f"no sample {sid!r}")
    index.refresh()
    with index.lock:
        i = index.by_sid.get(sid)
        if i is None:
            raise NotFound(f"no sample {sid!r} in this run")
        return {**index.read(i), "sid": sid}


def trace_answer(run: Run, max_events: int) -> dict:
    """The run's spans (core/trace.py's load_trace: trace.json or the live shards),
    its processes and threads, and the utilisation summary (results.json's, else each
    process's busy fraction from its spans)."""

    folder, merged = run.path / tr.TRACE_DIR, run.path / tr.TRACE_FILE
    if folder.is_symlink() or merged.is_symlink() or \
            any(p.is_symlink() for p in (folder.iterdir() if folder.is_dir() else ())):
        raise NotFound("this run's trace holds a symlink; the dashboard reads only plain files "
                       "inside the runs folder")
    parts = [merged, *tr.shards(run.path)]
    key = (max_events, tuple((p.name, p.stat().st_size, p.stat().st_mtime_ns)
                             for p in parts if p.exists()))
    with run.trace_lock:
        if key != run.trace_key:
            try:
                events = tr.load_trace(run.path, max_events)["traceEvents"]
            except ValueError as e:  # a damaged shard or trace.json; relative names only
                raise Unreadable(f"this run's trace cannot be read: "
                                 f"{str(e).replace(str(run.path) + '/', '')}") from None
            run.trace, run.trace_key = _spans(events), key
        answer = run.trace
    results = read_json(run.path / "results.json") or {}
    return {"processes": answer["processes"], "spans": answer["spans"],
            "utilisation": results.get("utilisation") or answer["busy"]}


def _spans(events: list[dict]) -> dict:
    procs: dict[int, dict] = {}
    spans, intervals = [], {}
    for e in events:
        pid = e.get("pid")
        if e.get("ph") == "M":
            p = procs.setdefault(pid, {"pid": pid, "name": str(pid), "threads": {}})
            name = (e.get("args") or {}).get("name")
            if e.get("name") == "process_name" and name:
                p["name"] = name
            elif e.get("name") == "thread_name" and name:
                p["threads"][str(e.get("tid"))] = name
            elif e.get("name") == "process_sort_index":
                p["sort_index"] = (e.get("args") or {}).get("sort_index")
        elif e.get("ph") == "X" and isinstance(e.get("ts"), (int, float)):
            procs.setdefault(pid, {"pid": pid, "name": str(pid), "threads": {}})
            dur = e.get("dur") or 0
            spans.append({"name": e.get("name"), "cat": e.get("cat"), "pid": pid,
                          "tid": e.get("tid"), "ts": e["ts"], "dur": dur,
                          "args": e.get("args") or {}})
            intervals.setdefault(pid, []).append((e["ts"], e["ts"] + dur))
    busy = {}
    for pid, ivs in intervals.items():
        ivs.sort()
        total, end = 0.0, -math.inf
        for a, b in ivs:
            total += max(0.0, b - max(a, end))
            end = max(end, b)
        wall = end - ivs[0][0]
        busy[procs[pid]["name"]] = {"busy_s": total / 1e6, "wall_s": wall / 1e6,
                                    "busy_frac": total / wall if wall > 0 else None}
    return {"processes": sorted(procs.values(), key=lambda p: (p.get("sort_index") or 0,
                                                                str(p["name"]))),
            "spans": spans, "busy": busy}


def eval_summary(ident: str, path: Path) -> dict:
    s = read_json(path / "summary.json") or {}
    scores = s.get("scores") if isinstance(s.get("scores"), dict) else {}
    means = {k: v.get("mean") for k, v in scores.items() if isinstance(v, dict)}
    return {"id": ident, "model": s.get("model"), "engine": s.get("engine"), "scores": means,
            "age_s": round(time.time() - (path / "summary.json").stat().st_mtime, 3)}
