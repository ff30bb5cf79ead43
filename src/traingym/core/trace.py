"""Where the time went: spans from every process of a run, as a Chrome/Perfetto trace.

Each process calls `start(trace_dir, role)` once; each `with trace.span("generate", cat="engine"):`
then appends one complete event (ph="X") as a JSON line to the process's own shard,
`trace/<role>-<pid>.jsonl`, flushed when the span ends: a live run is readable and a crash loses
only open spans. Timestamps are wall-clock microseconds, so processes line up.
`merge(run_dir)` joins the shards into `trace.json` for ui.perfetto.dev; `load_trace` reads a live
or finished run. Spans inside an asyncio task lie on an "async lane" held by that task, so spans on
one track always nest, as the format requires. Off, `span` is a shared no-op. Ray actors on other
nodes `start(None, role)` and ship spans back with each result (`drain`, `write_shipped`).
Not covered: equal pids on different nodes (one track), flow arrows, clock skew between nodes; spans
held by an actor that dies.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path

TRACE_DIR = "trace"  # shards under the run directory
TRACE_FILE = "trace.json"


def now_us() -> int:
    return time.time_ns() // 1000


class _Off:
    """The span when tracing is off: does nothing, shared."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


_OFF = _Off()


class _Tracer:
    def __init__(self, directory: Path | None, role: str):
        self.role, self.pid = role, os.getpid()
        self.lock = threading.Lock()
        self.threads: dict[int, int] = {}  # thread ident -> tid
        self.free_lanes: list[int] = []
        self.lanes = 0
        self.task_lane: dict[int, list] = {}  # id(task) -> [lane tid, open spans]
        self.held: list[str] = []  # with no directory: lines kept for drain()
        self.file = None
        if directory is not None:
            directory = directory.resolve()  # handed to processes with another cwd (Ray)
            directory.mkdir(parents=True, exist_ok=True)
            self.path = directory / f"{_safe(role)}-{self.pid}.jsonl"
            self.file = open(self.path, "a", buffering=1)
        self._meta("process_name", {"name": f"{role} (pid {self.pid})"})
        self._meta("process_sort_index", {"sort_index": _sort_index(role)})

    def _write(self, event: dict) -> None:
        line = json.dumps(event, default=str) + "\n"
        with self.lock:
            if self.file is not None:
                self.file.write(line)
            else:
                self.held.append(line)

    def _meta(self, name: str, args: dict, tid: int = 0) -> None:
        self._write({"name": name, "ph": "M", "pid": self.pid, "tid": tid, "args": args})

    def thread_tid(self) -> int:
        ident = threading.get_ident()
        tid = self.threads.get(ident)
        if tid is None:
            with self.lock:
                tid = self.threads.setdefault(ident, len(self.threads) + 1)
            self._meta("thread_name", {"name": threading.current_thread().name}, tid)
        return tid

    def enter_lane(self, task) -> int:
        held = self.task_lane.get(id(task))
        if held is None:
            with self.lock:
                if self.free_lanes:
                    tid, new = self.free_lanes.pop(), False
                else:
                    self.lanes += 1
                    tid, new = 1000 + self.lanes, True
                held = self.task_lane[id(task)] = [tid, 0]
            if new:
                self._meta("thread_name", {"name": f"async lane {tid - 1000}"}, tid)
        held[1] += 1
        return held[0]

    def leave_lane(self, task) -> None:
        held = self.task_lane[id(task)]
        held[1] -= 1
        if held[1] == 0:
            with self.lock:
                del self.task_lane[id(task)]
                self.free_lanes.append(held[0])

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
            self.file = None


_tracer: _Tracer | None = None


def _safe(role: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in role)


def _sort_index(role: str) -> int:
    order = ("trainer", "rank", "engine", "sandbox")
    return next((i for i, p in enumerate(order) if role.startswith(p)), len(order))


def start(trace_dir: str | Path | None, role: str) -> None:
    """Trace this process as `role` into `trace_dir` (None: keep spans for `drain`)."""
    global _tracer
    stop()
    _tracer = _Tracer(Path(trace_dir) if trace_dir is not None else None, role)


def stop() -> None:
    global _tracer
    if _tracer is not None:
        _tracer.close()
    _tracer = None


def enabled() -> bool:
    return _tracer is not None


def shard_dir() -> str | None:
    """Where this process's shard lies (for the processes it starts), None when off or held."""
    t = _tracer
    return str(t.path.parent) if t is not None and t.file is not None else None


def drain() -> list[str]:
    """The lines held since the last drain (tracing started without a directory)."""
    t = _tracer
    if t is None or not t.held:
        return []
    with t.lock:
        out, t.held = t.held, []
    return out


def write_shipped(lines: list[str], role: str = "", pid: int = 0) -> None:
    """Append lines another process shipped (a Ray actor on another node) as its shard."""
    t = _tracer
    if t is None or t.file is None or not lines:
        return
    with open(t.path.parent / f"{_safe(role)}-{pid}.jsonl", "a") as f:
        f.write("".join(lines))


class _Span:
    __slots__ = ("t", "name", "cat", "args", "ts", "tid", "task")

    def __init__(self, t: _Tracer, name: str, cat: str, args: dict):
        self.t, self.name, self.cat, self.args = t, name, cat, args

    def __enter__(self):
        self.task = _current_task()
        self.tid = (self.t.enter_lane(self.task) if self.task is not None
                    else self.t.thread_tid())
        self.ts = now_us()
        return self

    def __exit__(self, exc_type, exc, tb):
        end = now_us()
        if exc_type is not None:
            self.args["error"] = exc_type.__name__
        self.t._write({"name": self.name, "cat": self.cat, "ph": "X", "ts": self.ts,
                       "dur": end - self.ts, "pid": self.t.pid, "tid": self.tid,
                       "args": self.args})
        if self.task is not None:
            self.t.leave_lane(self.task)
        return False


def _current_task():
    aio = sys.modules.get("asyncio")
    if aio is None or aio._get_running_loop() is None:
        return None
    return aio.current_task()


def span(name: str, cat: str = "run", **args):
    """A context manager that records `name` (category `cat`, `args` shown beside it)."""
    t = _tracer
    if t is None:
        return _OFF
    return _Span(t, name, cat, args)


def complete(name: str, cat: str, start_us: int, end_us: int, **args) -> None:
    """Record a span measured by hand (its ends are not in one block of code)."""
    t = _tracer
    if t is None or end_us <= start_us:
        return
    t._write({"name": name, "cat": cat, "ph": "X", "ts": start_us, "dur": end_us - start_us,
              "pid": t.pid, "tid": t.thread_tid(), "args": args})


def took(name: str, cat: str, seconds: float, **args) -> None:
    """Record a span that ends now and lasted `seconds`."""
    if _tracer is not None:
        end = now_us()
        complete(name, cat, end - int(seconds * 1e6), end, **args)


# ---- reading -------------------------------------------------------------------------------

def read_shard(path: Path, offset: int = 0) -> tuple[list[dict], int]:
    """Events of one shard from byte `offset`, and the offset after the last complete line.
    A last line without its newline (being written, or cut by a crash) is left out; a broken
    line before it is an error naming the file."""
    with open(path, "rb") as f:
        f.seek(offset)
        data = f.read()
    end = data.rfind(b"\n") + 1
    events = []
    for n, line in enumerate(data[:end].splitlines()):
        if not line.strip():
            continue
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: line {n + 1} after byte {offset} is not JSON ({e.msg}); "
                             "the shard is damaged: move it away to read the rest") from None
    return events, offset + end


def shards(run_dir: str | Path) -> list[Path]:
    folder = Path(run_dir) / TRACE_DIR
    return sorted(folder.glob("*.jsonl")) if folder.is_dir() else []


def _assemble(events: list[dict], max_events: int | None) -> dict:
    meta, spans, seen = [], [], set()
    for e in events:
        if e.get("ph") == "M":
            key = (e["name"], e["pid"], e.get("tid"))
            if key not in seen:
                seen.add(key)
                meta.append(e)
        else:
            spans.append(e)
    spans.sort(key=lambda e: e["ts"])
    if max_events is not None and len(spans) > max_events:
        spans = spans[len(spans) - max_events:]  # the latest
    return {"traceEvents": meta + spans, "displayTimeUnit": "ms"}


def collect(run_dir: str | Path, max_events: int | None = None) -> dict:
    """The shards of `run_dir` merged now (complete lines only)."""
    events: list[dict] = []
    for path in shards(run_dir):
        events.extend(read_shard(path)[0])
    return _assemble(events, max_events)


def merge(run_dir: str | Path) -> Path | None:
    """Write `trace.json` from the shards (atomically); None when there are none."""
    if not shards(run_dir):
        return None
    out = Path(run_dir) / TRACE_FILE
    tmp = out.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(collect(run_dir)))
    os.replace(tmp, out)
    return out


def load_trace(run_dir: str | Path, max_events: int | None = None) -> dict:
    """The run's trace as {"traceEvents": [...]}: trace.json when it is newer than every shard
    (a finished run), else the shards merged now (a live or crashed run). `max_events` keeps
    the latest that many spans (metadata always kept). A run without a trace gives no events."""
    run_dir = Path(run_dir)
    parts = shards(run_dir)
    merged = run_dir / TRACE_FILE
    if merged.exists() and all(p.stat().st_mtime <= merged.stat().st_mtime for p in parts):
        events = json.loads(merged.read_text())["traceEvents"]
        return _assemble(events, max_events)
    return collect(run_dir, max_events)
