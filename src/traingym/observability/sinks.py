"""Metric sinks beside events.jsonl: the seam, its `SINKS` registry, and the set a run writes to.

events.jsonl is the source of truth; a sink copies each step record's numbers to TensorBoard,
W&B, MLflow or a "module:Class". Names, options and packages are checked when the config is
built, so a typo or a missing extra fails before any work; a sink that raises at run time is
reported once and dropped, and the run goes on. SFT-phase records go under `sft/`.
Covered: numbers only (ints and finite floats).
Not covered: samples, traces and checkpoints as sink artifacts.
"""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path
from typing import Any, Protocol

from traingym.core.errors import did_you_mean
from traingym.core.registry import Registry, RegistryError


class Sink(Protocol):
    """One metric destination. A class also declares `requires` (modules it imports, checked
    with find_spec when the config is built), `extra` (the pip extra that installs them) and
    `options` (the option names it accepts from observability.sink_options)."""

    def open(self, run_dir: Path, config: dict[str, Any], options: dict[str, Any]) -> None:
        """`config`: the run's resolved config as JSON (what a tracker records as params)."""

    def log(self, step: int, record: dict[str, float]) -> None: ...
    def close(self) -> None: ...


def _sink(name: str, cls):
    if not isinstance(cls, type) or not all(callable(getattr(cls, m, None))
                                            for m in ("open", "log", "close")):
        raise TypeError("not a sink class (one with open, log and close)")
    missing = [a for a in ("requires", "extra", "options") if not hasattr(cls, a)]
    if missing:
        raise TypeError(f"a sink class declares {missing[0]!r} (observability/sinks.py Sink)")
    return cls


SINKS = Registry("observability.sinks", {
    "tensorboard": "traingym.observability.sink_tensorboard:TensorBoardSink",
    "wandb": "traingym.observability.sink_wandb:WandbSink",
    "mlflow": "traingym.observability.sink_mlflow:MlflowSink",
}, check=_sink)

sink_class = SINKS.get  # the sink class for a name here or a "module:Class" path


def check(names: list[str], options: dict[str, dict[str, Any]]) -> None:
    """Raise ValueError naming the problem and the fix for an unknown or repeated sink, an
    option of a sink that is not chosen or that it does not take, or a package not installed."""

    for name in names:
        try:
            sink_class(name)
        except RegistryError as e:
            raise ValueError(f"{e} (events.jsonl and the console are always written)") from None
    if len(set(names)) != len(names):
        raise ValueError(f"observability.sinks lists a sink twice: {names}")
    for name, opts in options.items():
        if name not in names:
            raise ValueError(f"observability.sink_options.{name}: {name!r} is not in "
                             f"observability.sinks {names}; add it there or drop its options")
    for name in names:
        cls = sink_class(name)
        unknown = sorted(set(options.get(name, {})) - set(cls.options))
        if unknown:
            raise ValueError(f"observability.sink_options.{name}: unknown option "
                             f"{unknown[0]!r}; {name} takes {sorted(cls.options)}"
                             f"{did_you_mean(unknown[0], cls.options)}")
        absent = [m for m in cls.requires if importlib.util.find_spec(m) is None]
        if absent:
            raise ValueError(f"observability.sinks: {name!r} needs the {absent[0]!r} package, "
                             f"which is not installed: pip install 'traingym[{cls.extra}]'")


def scalars(record: dict[str, Any]) -> tuple[int, dict[str, float]]:
    """(step, the record's numbers): RL records by `step`, SFT records under `sft/`."""
    sft = record.get("phase") == "sft"
    step = int(record["sft_step"] if sft else record["step"])
    out = {}
    for k, v in record.items():
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            continue
        if k in ("schema", "step", "phase"):
            continue
        out[f"sft/{k}" if sft else k] = float(v)
    return step, out


class Sinks:
    """The sinks of one run: opened at the first record, each dropped at its first error."""

    def __init__(self, run_dir: Path, obs: Any, config: dict[str, Any]):
        """`obs`: the observability section (observability/config.py); `config`: the run's."""
        self.run_dir, self.config = Path(run_dir), config
        self.pending = [(n, dict(obs.sink_options.get(n, {}))) for n in obs.sinks]
        self.live: dict[str, Any] = {}
        self.failed: dict[str, str] = {}  # name -> the error reported

    def _drop(self, name: str, where: str, err: BaseException) -> None:
        self.live.pop(name, None)
        self.failed[name] = f"{type(err).__name__}: {err}"
        print(f"traingym: sink {name!r} failed in {where} ({self.failed[name]}); it is dropped "
              "and the run goes on (events.jsonl has every step)", file=sys.stderr, flush=True)

    def _open(self) -> None:
        pending, self.pending = self.pending, []
        for name, options in pending:
            try:
                sink = sink_class(name)()
                sink.open(self.run_dir, self.config, options)
            except Exception as e:  # a sink never stops the run (reported once)
                self._drop(name, "open", e)
            else:
                self.live[name] = sink

    def log(self, record: dict[str, Any]) -> None:
        if self.pending:
            self._open()
        if not self.live:
            return
        step, values = scalars(record)
        for name, sink in list(self.live.items()):
            try:
                sink.log(step, values)
            except Exception as e:  # a sink never stops the run (reported once)
                self._drop(name, "log", e)

    def close(self) -> None:
        self.pending = []
        for name, sink in list(self.live.items()):
            try:
                sink.close()
            except Exception as e:  # a sink never stops the run (reported once)
                self._drop(name, "close", e)
        self.live = {}
