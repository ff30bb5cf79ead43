"""A toy metric sink: one JSON line per record it gets, {"step": ..., "record": {...}}, to
`observability.sink_options.<name>.path` (default RUN/toy_sink.jsonl). Test-only: proof that a
sink is one file plus one registry line (observability/sinks.py SINKS) or a "module:Class"
path in `observability.sinks`.
"""

from __future__ import annotations

import json
from pathlib import Path


class ToySink:
    requires: tuple[str, ...] = ()
    extra = ""
    options = ("path",)

    def open(self, run_dir, cfg, options):
        path = options.get("path") or Path(run_dir) / "toy_sink.jsonl"
        self.file = open(path, "a")  # noqa: SIM115 (closed in close)

    def log(self, step, record):
        self.file.write(json.dumps({"step": step, "record": record}) + "\n")
        self.file.flush()

    def close(self):
        self.file.close()
