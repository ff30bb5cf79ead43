"""Incremental, in-memory indexes of a run's events.jsonl and samples.jsonl.

Each index reads only what was appended since its last `refresh()` (whole lines only), and
re-reads from the start when the file shrank, its earlier bytes changed, or (events) steps go
back, as a resumed run truncates and rewrites its logs. `EventsIndex` keeps step records as
columns with running sums for charted keys, so a downsampled series costs two subtractions per
point; callers hold `lock`. `SamplesIndex` keeps per-sample offsets, step, reward, sid and
search text (a record without `sid` gets `L<line number>`), and counts env_info statuses.
Not covered: a rewrite to the same size with the same last 64 bytes goes unnoticed until the
steps go back; non-JSON lines are skipped and counted (`bad_lines`).
"""

from __future__ import annotations

import bisect
import json
import math
import os
import re
import threading
from array import array
from pathlib import Path

MISSING = object()


class FileChanged(Exception):
    """The file changed between indexing and reading back a record; the client asks again."""


CHUNK = 8 << 20  # bytes read at a time
TAIL = 64  # bytes before the offset compared to notice a rewritten file
SID_RE = re.compile(r"[A-Za-z0-9._:-]{1,128}")


class _Tail:
    """Append-only reading of one file: yields (offset, line bytes) of complete new lines."""

    def __init__(self, path: Path):
        self.path, self.offset, self.tail = path, 0, b""

    def changed_under_us(self, f, size: int) -> bool:
        if size < self.offset:
            return True
        if not self.offset:
            return False
        start = max(0, self.offset - TAIL)
        f.seek(start)
        return f.read(self.offset - start) != self.tail

    def read_new(self, f, size: int):
        pos = self.offset
        f.seek(pos)
        rest = b""
        while pos + len(rest) < size:
            data = rest + f.read(min(CHUNK, size - pos - len(rest)))
            if not data or len(data) == len(rest):
                break
            end = data.rfind(b"\n")
            if end < 0:
                rest = data
                continue
            start = 0
            while start <= end:
                nl = data.index(b"\n", start)
                yield pos + start, data[start:nl]
                start = nl + 1
            pos += end + 1
            rest = data[end + 1:]
        if pos != self.offset:
            self.offset = pos
            f.seek(max(0, pos - TAIL))
            self.tail = f.read(pos - max(0, pos - TAIL))


def _open_regular(path: Path):
    """The file opened for reading, or None if absent; a symlink is refused (O_NOFOLLOW)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return None
    except OSError as e:  # ELOOP: a symlink
        raise PermissionError(f"{path.name} is a symlink; the dashboard reads only plain files "
                              "inside the runs folder") from e
    return os.fdopen(fd, "rb")


class EventsIndex:
    def __init__(self, path: Path):
        self.path = path
        self.lock = threading.Lock()
        self._reset()

    def _reset(self) -> None:
        self.tail = _Tail(self.path)
        self.steps: list[int] = []
        self.columns: dict[str, list] = {}
        # per charted key (made on its first series): its numeric values (NaN where none),
        # their prefix sums and counts (length len(steps) + 1): a bucket's mean is two
        # subtractions
        self.values: dict[str, array] = {}
        self.sums: dict[str, array] = {}
        self.counts: dict[str, array] = {}
        self.bad_lines = 0
        self.resets = getattr(self, "resets", -1) + 1

    def refresh(self) -> None:
        with self.lock:
            f = _open_regular(self.path)
            if f is None:
                if self.steps:
                    self._reset()
                return
            with f:
                size = os.fstat(f.fileno()).st_size
                if self.tail.changed_under_us(f, size):
                    self._reset()
                new = []
                for _, line in self.tail.read_new(f, size):
                    rec = _parse(line)
                    if rec is None or not isinstance(rec.get("step"), int):
                        self.bad_lines += line.strip() != b""
                        continue
                    new.append(rec)
                if new and self.steps and _went_back(new[0], self.steps[-1]):
                    self._reset()  # steps went back: a resume rewrote the file; read it again
                    self.tail.offset = 0
                    f.seek(0)
                    new = [r for _, ln in self.tail.read_new(f, size)
                           if (r := _parse(ln)) is not None and isinstance(r.get("step"), int)]
                for rec in new:
                    self._append(rec)

    def _append(self, rec: dict) -> None:
        n = len(self.steps)
        self.steps.append(rec["step"])
        for key, value in rec.items():
            col = self.columns.get(key)
            if col is None:
                col = self.columns[key] = [MISSING] * n
            col.append(value)
        for col in self.columns.values():
            if len(col) == n:
                col.append(MISSING)

    def _numeric(self, key: str) -> tuple[array, array, array]:
        """The key's values, prefix sums and counts, brought up to date (made on first use)."""
        if key not in self.values:
            self.values[key], self.sums[key], self.counts[key] = \
                array("d"), array("d", [0.0]), array("q", [0])
        values, sums, counts = self.values[key], self.sums[key], self.counts[key]
        col = self.columns[key]
        for v in col[len(values):]:
            x = _num(v)
            values.append(math.nan if x is None else x)
            sums.append(sums[-1] + (0.0 if x is None else x))
            counts.append(counts[-1] + (x is not None))
        return values, sums, counts

    def __len__(self) -> int:
        return len(self.steps)

    @property
    def last_step(self) -> int:
        return self.steps[-1] if self.steps else 0

    def record(self, i: int) -> dict:
        return {k: col[i] for k, col in self.columns.items() if col[i] is not MISSING}

    def after(self, step: int, limit: int) -> list[dict]:
        start = bisect.bisect_right(self.steps, step)
        return [self.record(i) for i in range(start, min(len(self.steps), start + limit))]

    def last(self, key: str):
        col = self.columns.get(key, ())
        for v in reversed(col):
            if v is not MISSING and v is not None:
                return v
        return None

    def total(self, key: str) -> tuple[float, int]:
        """(sum, count) of the key's numeric values (records without it, or with a
        non-number, left out)."""
        if key not in self.columns:
            return 0.0, 0
        _, sums, counts = self._numeric(key)
        return sums[-1], counts[-1]

    def maximum(self, key: str) -> float | None:
        return max((x for x in self._numeric(key)[0] if x == x), default=None) \
            if key in self.columns else None

    def series(self, keys: list[str], max_points: int) -> dict[str, list]:
        """{'step': [...], key: [...]} with at most `max_points` points: the steps fall in
        equal buckets of consecutive records; each point is the bucket's last step and the mean
        of the key's numeric values in it (null where it has none)."""
        n = len(self.steps)
        bucket = max(1, math.ceil(n / max_points)) if max_points > 0 else max(n, 1)
        bounds = [(i, min(n, i + bucket)) for i in range(0, n, bucket)]
        out: dict[str, list] = {"step": [self.steps[b - 1] for _, b in bounds]}
        for key in keys:
            col = self.columns.get(key)
            if col is None:
                out[key] = [None] * len(bounds)
            elif bucket == 1:
                out[key] = [None if x != x else x for x in self._numeric(key)[0]]
            else:
                _, sums, counts = self._numeric(key)
                out[key] = [(sums[b] - sums[a]) / k if (k := counts[b] - counts[a]) else None
                            for a, b in bounds]
        return out


def _went_back(rec: dict, last: int) -> bool:
    """Does `rec`, the first new record, redo a step already read? SFT-phase records all carry
    step 0 (docs/events.md), so they may repeat it."""
    return rec["step"] < last or rec["step"] == last and rec.get("phase") != "sft"


def _num(v):
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return v if math.isfinite(v) else None


def _parse(line: bytes):
    try:
        rec = json.loads(line)
    except (ValueError, UnicodeDecodeError):
        return None
    return rec if isinstance(rec, dict) else None


def _text(rec: dict) -> str:
    parts = [rec.get("prompt"), rec.get("completion")]
    return "\x00".join(p if isinstance(p, str) else json.dumps(p) for p in parts
                       if p is not None).lower()


class SamplesIndex:
    def __init__(self, path: Path):
        self.path = path
        self.lock = threading.Lock()
        self._reset()

    def _reset(self) -> None:
        self.tail = _Tail(self.path)
        self.offsets = array("q")
        self.steps = array("q")
        self.rewards = array("d")  # NaN: no numeric reward
        self.sids: list[str] = []
        self.texts: list[str] = []
        self.by_sid: dict[str, int] = {}
        self.lines = 0
        self.bad_lines = 0
        self.verdicts: dict[str, int] = {}  # env_info statuses (a code env's sandbox verdict)

    def refresh(self) -> None:
        with self.lock:
            f = _open_regular(self.path)
            if f is None:
                if self.sids:
                    self._reset()
                return
            with f:
                size = os.fstat(f.fileno()).st_size
                if self.tail.changed_under_us(f, size):
                    self._reset()
                for offset, line in self.tail.read_new(f, size):
                    self.lines += 1
                    rec = _parse(line)
                    if rec is None:
                        self.bad_lines += line.strip() != b""
                        continue
                    self._add(offset, rec)

    def _add(self, offset: int, rec: dict) -> None:
        sid = rec.get("sid")
        sid = str(sid) if sid is not None else f"L{self.lines - 1}"
        if not SID_RE.fullmatch(sid) or sid in self.by_sid:
            sid = f"L{self.lines - 1}"
        step, reward = rec.get("step"), _num(rec.get("reward"))
        self.by_sid[sid] = len(self.sids)
        self.sids.append(sid)
        self.offsets.append(offset)
        self.steps.append(step if isinstance(step, int) and not isinstance(step, bool) else -1)
        self.rewards.append(math.nan if reward is None else float(reward))
        self.texts.append(_text(rec))
        info = rec.get("env_info")
        for item in info if isinstance(info, list) else ():
            status = item.get("status") if isinstance(item, dict) else None
            if isinstance(status, str):
                self.verdicts[status] = self.verdicts.get(status, 0) + 1

    def __len__(self) -> int:
        return len(self.sids)

    def query(self, q: str = "", step: int | None = None, min_reward: float | None = None,
              max_reward: float | None = None, offset: int = 0, limit: int = 50,
              newest_first: bool = True) -> tuple[int, list[int]]:
        """(number of matches, the positions of matches offset..offset+limit)."""
        q = q.lower()
        steps, rewards, texts = self.steps, self.rewards, self.texts
        order = range(len(self.sids) - 1, -1, -1) if newest_first else range(len(self.sids))
        lo = -math.inf if min_reward is None else min_reward
        hi = math.inf if max_reward is None else max_reward
        by_reward = min_reward is not None or max_reward is not None
        total, page = 0, []
        for i in order:
            if step is not None and steps[i] != step:
                continue
            if by_reward and not lo <= rewards[i] <= hi:  # NaN never matches a bound
                continue
            if q and q not in texts[i]:
                continue
            if offset <= total < offset + limit:
                page.append(i)
            total += 1
        return total, page

    def read(self, i: int) -> dict:
        return self.read_many([i])[0]

    def read_many(self, positions: list[int]) -> list[dict]:
        out = []
        f = _open_regular(self.path)
        if f is None:
            raise FileChanged("the samples file is gone; ask again")
        with f:
            for i in positions:
                f.seek(self.offsets[i])
                rec = _parse(f.readline())
                if rec is None:
                    raise FileChanged("the samples file changed while it was read; ask again")
                out.append(rec)
        return out
