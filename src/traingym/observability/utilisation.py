"""Utilisation from the trace: how much of a window each component was busy, and what it waited
on. Computed from the spans alone (core/trace.py), so the keys are absent without
`observability.trace`.

Per step: util_trainer_busy, util_engines_busy, wait_trainer_on_rollout_s,
wait_engines_on_weights_s, wait_sandbox_queue_s, util_env_s (summed over concurrent calls, so
it may exceed the step). `summary(run_dir)` gives results.json's `utilisation` over the
training steps; `line()` the printed line.
Limits: a span counts once ended and read, clipped to the window, so per-step engine figures
can lag a step; time between spans counts as idle; a restarted engine is a new process.
"""

from __future__ import annotations

from pathlib import Path

from traingym.core import trace

TRAINER_CATS = ("trainer", "weights", "checkpoint")


def _role(meta_name: str) -> str:
    return meta_name.rsplit(" (pid ", 1)[0]


def union_s(intervals: list[tuple[int, int]], a: int, b: int) -> float:
    """Seconds of [a, b] (microseconds) covered by the intervals."""
    clipped = sorted((max(s, a), min(e, b)) for s, e in intervals if e > a and s < b)
    total, end = 0, a
    for s, e in clipped:
        if e > end:
            total += e - max(s, end)
            end = e
    return total / 1e6


def sum_s(intervals: list[tuple[int, int]], a: int, b: int) -> float:
    return sum(max(0, min(e, b) - max(s, a)) for s, e in intervals) / 1e6


class Spans:
    """Spans and process roles, read incrementally from a run's shards."""

    def __init__(self, run_dir: Path):
        self.run_dir, self.offsets = Path(run_dir), {}
        self.roles: dict[int, str] = {}
        self.spans: list[dict] = []

    def read(self) -> None:
        for path in trace.shards(self.run_dir):
            events, self.offsets[path] = trace.read_shard(path, self.offsets.get(path, 0))
            for e in events:
                if e.get("ph") == "X":
                    self.spans.append(e)
                elif e.get("name") == "process_name":
                    self.roles[e["pid"]] = _role(e["args"]["name"])

    def forget_before(self, us: int) -> None:
        self.spans = [e for e in self.spans if e["ts"] + e["dur"] > us]

    def intervals(self, pid=None, cats=None, names=None) -> list[tuple[int, int]]:
        return [(e["ts"], e["ts"] + e["dur"]) for e in self.spans
                if (pid is None or e["pid"] == pid) and (cats is None or e.get("cat") in cats)
                and (names is None or e["name"] in names)]

    def pids(self, prefix: str) -> list[int]:
        return sorted(p for p, r in self.roles.items() if r.startswith(prefix))

    def engine_pids(self) -> list[int]:
        """Engine processes; sync mode: the trainer's, if it generated."""
        found = self.pids("engine")
        if found:
            return found
        return [p for p in self.pids("trainer") if self.intervals(p, names=("generate",))]


def window(sp: Spans, a: int, b: int) -> dict:
    """The per-step keys for [a, b] (microseconds, wall clock)."""
    length = max(b - a, 1) / 1e6
    trainers = sp.pids("trainer")
    engines = sp.engine_pids()
    busy = [union_s(sp.intervals(p, names=("generate",)), a, b) / length for p in engines]
    return {
        "util_trainer_busy": sum(union_s(sp.intervals(p, cats=TRAINER_CATS), a, b)
                                 for p in trainers) / length,
        "util_engines_busy": sum(busy) / len(busy) if busy else None,
        "wait_trainer_on_rollout_s": sum(union_s(sp.intervals(p, names=("collect",)), a, b)
                                         for p in trainers),
        "wait_engines_on_weights_s": sum_s(sp.intervals(names=("wait_weights",)), a, b),
        "wait_sandbox_queue_s": sum_s(sp.intervals(names=("sandbox_acquire",)), a, b),
        "util_env_s": sum_s(sp.intervals(cats=("env",)), a, b),
    }


class StepUtilisation:
    """The trainer's per-step view: `keys(a, b)` reads what the shards gained and returns
    `window`'s keys; spans that ended before the window are forgotten."""

    def __init__(self, run_dir: Path):
        self.spans = Spans(run_dir)

    def keys(self, a_us: int, b_us: int) -> dict:
        self.spans.read()
        out = window(self.spans, a_us, b_us)
        self.spans.forget_before(b_us)
        return out


def summary(run_dir: str | Path) -> dict:
    """The whole run: per process busy/idle seconds and what it waited on."""
    sp = Spans(Path(run_dir))
    sp.read()
    trainers = sp.pids("trainer")
    mine = [(s, e) for p in trainers for s, e in sp.intervals(p, names=("step",))]
    if not mine:  # no step ran
        return {}
    a, b = min(s for s, _ in mine), max(e for _, e in mine)
    wall = (b - a) / 1e6
    out: dict = {"wall_s": wall, "processes": {}}
    kinds = [(p, "trainer", TRAINER_CATS, None) for p in trainers]
    kinds += [(p, "rank", ("trainer",), None) for p in sp.pids("rank")]
    kinds += [(p, "engine", None, ("generate",)) for p in sp.engine_pids()]
    for pid, kind, cats, names in kinds:
        busy = union_s(sp.intervals(pid, cats=cats, names=names), a, b)
        waits = {}
        if kind == "trainer":
            waits["rollouts_s"] = union_s(sp.intervals(pid, names=("collect",)), a, b)
        if kind == "engine":
            waits["weights_s"] = sum_s(sp.intervals(pid, names=("wait_weights",)), a, b)
        key = f"{sp.roles[pid]}-{pid}" if kind != "trainer" or len(trainers) > 1 else "trainer"
        if kind == "engine" and sp.roles[pid] == "trainer":
            key = "engine (in trainer)"
        out["processes"][key] = {"busy_s": busy, "idle_s": wall - busy,
                                 "busy_frac": busy / wall if wall else 0.0, "waits": waits}
    out["sandbox_queue_wait_s"] = sum_s(sp.intervals(names=("sandbox_acquire",)), a, b)
    out["env_s"] = sum_s(sp.intervals(cats=("env",)), a, b)
    return out


def line(s: dict) -> str:
    """One line for the terminal."""
    if not s:
        return "utilisation: no trace"
    parts = []
    for name, p in s["processes"].items():
        waits = ", ".join(f"waited {v:.1f} s on {k.removesuffix('_s')}"
                          for k, v in p["waits"].items() if v > 0)
        parts.append(f"{name} {p['busy_frac']:.0%} busy" + (f" ({waits})" if waits else ""))
    if s["sandbox_queue_wait_s"] > 0:
        parts.append(f"sandbox queue wait {s['sandbox_queue_wait_s']:.1f} s")
    return f"utilisation over {s['wall_s']:.1f} s: " + "; ".join(parts)
