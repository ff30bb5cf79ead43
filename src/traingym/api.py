"""`traingym.train(config)`: the Python entry point the CLI also uses."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

from traingym.config.load import as_config, run_config
from traingym.config.schema import Config
from traingym.core import trace
from traingym.envs.evaluate import Score, z_text
from traingym.loop.async_loop import async_train_loop
from traingym.loop.build import Run, build_run, eval_report
from traingym.loop.sft import sft_phase
from traingym.loop.sync import train_loop
from traingym.observability import utilisation
from traingym.runs import index
from traingym.runs.index import RunView
from traingym.runs.preempt import Preemption


@dataclass
class TrainResult:
    run_dir: Path
    final_metrics: dict  # the last step's events.jsonl record
    eval: dict  # before / after / paired delta, greedy and sampled (empty without eval rows)


def _load_scores(path: Path) -> dict[str, Score] | None:
    if not path.exists():
        return None
    return {k: Score(**v) for k, v in json.loads(path.read_text()).items()}


def _save_scores(path: Path, scores: dict[str, Score]) -> None:
    path.write_text(json.dumps({k: vars(v) for k, v in scores.items()}))


def open_run(run_dir: str | Path) -> RunView:
    """A run directory as an object (runs/index.py), its `config` validated by this version."""
    return index.open_run(run_dir, read_config=run_config)


def default_run_dir(cfg: Config) -> Path:
    return Path("runs") / f"{cfg.task.name}-{time.strftime('%Y%m%d-%H%M%S')}"


def train(config: Config | dict | str | Path | None = None, *, dataset=None, eval_dataset=None,
          reward=None, env=None, group_reward=None, run_dir: str | Path | None = None,
          resume: bool = False, progress: bool = True) -> TrainResult:
    """Run RL post-training. `config` is a Config, a dict, a config file path, or None for the
    embedded default. `dataset`/`eval_dataset` are lists of rows (or paths); `reward` is
    `def reward(sample) -> float` (single-turn). `env` builds an episode's Env from
    (example, renderer) instead, e.g. a MultiTurnEnv subclass or a ToolTask; `group_reward`
    maps the G samples of a group to their G rewards."""
    cfg = as_config(config)
    run_dir = Path(run_dir) if run_dir is not None else default_run_dir(cfg)
    with Preemption() as preemption:  # SIGTERM stops at a step boundary (runs/preempt.py)
        run, start = build_run(cfg, run_dir, resume, dataset, eval_dataset, reward, progress,
                               env, group_reward)
        run.preemption = preemption
        try:
            return _train_run(cfg, run_dir, run, start)
        finally:  # after everything, results.json included, was written
            run.lock.release()


def _train_run(cfg: Config, run_dir: Path, run: Run, start: int) -> TrainResult:
    try:
        show = run.progress.message
        has_eval = bool(run.inputs.eval_rows) and cfg.eval.num_prompts > 0
        before = _load_scores(run_dir / "eval_before.json")
        if has_eval and cfg.eval.before and before is None:
            before = run.evaluate()
            _save_scores(run_dir / "eval_before.json", before)
        if before:
            show(_format("before", before))
        if cfg.sft.data is not None:  # the SFT warm start, then RL (loop/sft.py)
            sft_phase(run)
        if cfg.mode == "async":
            metrics = async_train_loop(run, start)
        else:
            metrics = train_loop(run, start)
        if not metrics:
            metrics = (json.loads((run_dir / "events.jsonl").read_text().splitlines()[-1])
                       if (run_dir / "events.jsonl").exists() else {})
        after = None
        if has_eval and cfg.eval.after:
            after = run.evaluate()
            _save_scores(run_dir / "eval_after.json", after)
            show(_format("after", after))
    finally:  # the engine side, transports and sandbox pools are released on errors too
        run.progress.close()
        try:
            run.close()
        finally:
            try:
                run.trainer.close()  # data-parallel ranks (trainer/distributed.py)
            finally:  # every process's spans are written: merge them (crashed runs too)
                trace.stop()
                trace.merge(run_dir)
    report = eval_report(before, after, cfg.eval.metric) if has_eval else {}
    if report.get("delta"):
        d = report["delta"]
        show("change (paired over prompts): " + "  ".join(
            f"{k} {v['delta']:+.3f} ± {v['se']:.3f}{z_text(v)}" for k, v in d.items()))
    usage = utilisation.summary(run_dir) if cfg.observability.trace else {}
    if usage:
        show(utilisation.line(usage))
    (run_dir / "results.json").write_text(json.dumps({"final": metrics, "eval": report,
                                                      "utilisation": usage}, indent=1))
    return TrainResult(run_dir, metrics, report)


def _format(label: str, scores: dict[str, Score]) -> str:
    parts = [f"{k} {v.mean:.3f} ± {v.se:.3f}" for k, v in scores.items()]
    n = next(iter(scores.values())).n_prompts
    return f"held-out reward {label} training ({n} prompts): " + "  ".join(parts)
