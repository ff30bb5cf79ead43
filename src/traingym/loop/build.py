"""Build a run from its config: rows, reward, model, engine, trainer, run directory; resume it.

Everything that can be checked without a model (config, rows, reward, run directory) is
checked before the model loads, so a bad input fails before any work starts.
"""

from __future__ import annotations

import json
import math
import os
import random
import statistics
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from traingym.cluster.preflight import check_cluster
from traingym.config.engines import engine_context
from traingym.config.load import upgrade
from traingym.config.schema import Config
from traingym.core import memory, trace
from traingym.core.errors import ConfigError
from traingym.core.precision import engine_dtype
from traingym.core.types import SamplingParams
from traingym.envs.base import EnvFactory
from traingym.envs.evaluate import as_dict, evaluate, paired_difference
from traingym.envs.factory import episode_factory
from traingym.envs.resources import RunResources
from traingym.envs.runner import EpisodeLimits, RolloutRunner
from traingym.loop.inputs import Inputs, resolve_inputs
from traingym.loop.trainer import build_trainer
from traingym.models.families import stop_token_ids
from traingym.models.loader import check_model_path, load_policy
from traingym.observability.events import RunLog
from traingym.observability.progress import Progress
from traingym.observability.sinks import Sinks
from traingym.observability.utilisation import StepUtilisation
from traingym.rollout.base import RolloutEngine
from traingym.rollout.registry import build as build_engine
from traingym.rollout.registry import check_engine
from traingym.runs import checkpoint
from traingym.runs import lock as runlock
from traingym.runs.preempt import Preemption, RunPreempted
from traingym.trainer.base import Trainer
from traingym.weights.colocated import ColocatedSync


class DataStream:
    """Training rows in a seeded order, a fresh permutation per epoch; resumable by position."""

    def __init__(self, rows: list[dict], seed: int, position: int = 0):
        self.rows, self.seed, self.position = rows, seed, position
        self._epoch, self._order = -1, []

    def take(self, n: int) -> list[tuple[int, dict]]:
        out = []
        for _ in range(n):
            epoch, offset = divmod(self.position, len(self.rows))
            if epoch != self._epoch:
                self._order = list(range(len(self.rows)))
                random.Random(self.seed * 1_000_003 + epoch).shuffle(self._order)
                self._epoch = epoch
            out.append((self.position, self.rows[self._order[offset]]))
            self.position += 1
        return out

    def row(self, index: int) -> dict:
        """The row `take` returned (or will return) at stream position `index`."""
        epoch, offset = divmod(index, len(self.rows))
        order = list(range(len(self.rows)))
        random.Random(self.seed * 1_000_003 + epoch).shuffle(order)
        return self.rows[order[offset]]


def _changed_keys(a: dict, b: dict, prefix: str = "") -> set[str]:
    """The dotted keys whose values differ between two resolved configs."""
    out = set()
    for k in a.keys() | b.keys():
        x, y = a.get(k), b.get(k)
        if isinstance(x, dict) and isinstance(y, dict):
            out |= _changed_keys(x, y, f"{prefix}{k}.")
        elif x != y:
            out.add(prefix + k)
    return out


def prepare_run_dir(run_dir: Path, cfg: Config, resume: bool, write: bool = True) -> None:
    """Never silently overwrite another run: a folder holding a run needs --resume. Creates
    the folder; writes config.json only with `write` (under the run directory's lock)."""
    config_path = run_dir / "config.json"
    resolved = cfg.model_dump(mode="json")
    if config_path.exists():
        if not resume:
            raise FileExistsError(f"{run_dir} already holds a run; pass --resume to continue it "
                                  "or choose another --run-dir")
        try:
            previous = upgrade(json.loads(config_path.read_text()))
        except json.JSONDecodeError as e:  # a start that died while writing it
            raise ConfigError(f"{config_path} is not valid JSON ({e.msg}), so the run cannot "
                              "be resumed; move the folder away or choose another --run-dir") \
                from None
        changed = _changed_keys(previous, resolved) - {"steps"}
        if changed:
            raise FileExistsError(f"{run_dir} holds a run with a different config "
                                  f"({', '.join(sorted(changed)[:5])} differ); only `steps` "
                                  "may change on --resume")
    elif resume:
        raise FileNotFoundError(f"--resume: {run_dir} holds no run to resume")
    if run_dir.exists() and not run_dir.is_dir():
        raise FileExistsError(f"--run-dir {run_dir} is a file, not a folder; choose another "
                              "--run-dir")
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:  # a file in its path, no permission, read-only filesystem
        raise ConfigError(f"--run-dir {run_dir}: cannot create it ({e.strerror}); choose "
                          "another --run-dir") from None
    if write:
        config_path.write_text(json.dumps(resolved, indent=1))


@dataclass
class Run:
    cfg: Config
    run_dir: Path
    inputs: Inputs
    tokenizer: Any
    trainer: Trainer
    engine: RolloutEngine
    factory: EnvFactory
    rollouts: RolloutRunner
    weights: ColocatedSync
    data: DataStream
    log: RunLog
    progress: Progress
    eval_stop_ids: tuple[int, ...]  # evaluation always ends at end of turn
    t_start: float = field(default_factory=time.monotonic)
    resumed: dict = field(default_factory=dict)  # the loop state of the checkpoint resumed
    lock: runlock.RunLock | None = None  # the run directory's; api.train releases it last
    preemption: Preemption | None = None  # SIGTERM's stop request (runs/preempt.py), set by train
    resources: RunResources = field(default_factory=RunResources)  # envs' pools (envs/resources.py)
    util: StepUtilisation | None = None  # per-step utilisation keys from the trace (trace on)

    def close(self) -> None:
        try:
            self.rollouts.close()
            self.resources.close()  # after every runner of the run closed its loop's part
            self.log.close()  # the sinks (observability/sinks.py)
        finally:
            try:
                self.weights.close()
            finally:
                self.engine.close()

    def maybe_checkpoint(self, step: int, loop_state: dict | None = None) -> bool:
        """Save after `step` if due; `loop_state` (JSON) is kept with the data position."""
        every = self.cfg.checkpoint.every
        if step + 1 != self.cfg.steps and not (every and (step + 1) % every == 0):
            return False
        self.save_checkpoint(step, loop_state)
        return True

    def save_checkpoint(self, step: int, loop_state: dict | None = None) -> None:
        with trace.span("checkpoint", cat="checkpoint", step=step + 1):
            self._save_checkpoint(step, loop_state)

    def _save_checkpoint(self, step: int, loop_state: dict | None = None) -> None:
        checkpoint.save(self.run_dir / "checkpoints", step + 1, self.trainer.model,
                        self.trainer.optimizer,
                        {"data_position": self.data.position, **(loop_state or {})},
                        keep=self.cfg.checkpoint.keep,
                        extra=checkpoint.extra_modules(self.trainer))

    def stop_if_preempted(self, step: int, saved: bool, loop_state: dict | None = None) -> None:
        """At the end of `step` (its record written): if SIGTERM came, commit a checkpoint of
        the step (unless `saved`, it was just written) and raise RunPreempted (runs/preempt.py).
        """
        if self.preemption is None or self.preemption.requested is None:
            return
        if step + 1 == self.cfg.steps:  # the last step: the run ends as it would anyway
            return
        if not saved:
            self.save_checkpoint(step, loop_state)
        raise RunPreempted(self.preemption.requested, step + 1, self.run_dir)

    def step_metrics(self, step, groups, batch, train_metrics, seconds, saved) -> dict:
        rewards = [s.reward for g in groups for s in g.samples if not s.drop_reason]
        lengths = [sum(s.loss_mask) for g in groups for s in g.samples]  # policy tokens
        gen_tokens = sum(lengths)
        return {
            "step": step + 1,
            "reward_mean": statistics.fmean(rewards) if rewards else math.nan,
            "reward_std": statistics.pstdev(rewards) if rewards else math.nan,
            **train_metrics,
            "completion_len_mean": statistics.fmean(lengths),
            "completion_len_max": max(lengths),
            "turns_mean": statistics.fmean(s.turns for g in groups for s in g.samples),
            "groups": len(groups), "groups_kept": len(batch.groups),
            "groups_dropped": batch.num_dropped_groups,
            "gen_tokens": gen_tokens,
            "gen_tokens_per_s": gen_tokens / max(seconds["rollout"], 1e-9),
            "tokens_per_s": gen_tokens / max(seconds["step"], 1e-9),
            **{f"seconds_{k}": v for k, v in seconds.items()},
            "checkpoint_saved": saved,
            "policy_version": min(v for g in groups for s in g.samples for v in s.versions
                                  if v >= 0),  # the oldest policy token (< 0: env tokens)
            **self.weights.last,
            "elapsed_s": time.monotonic() - self.t_start,
        }

    def evaluate(self) -> dict:
        r = self.cfg.rollout
        with trace.span("eval", cat="eval", prompts=len(self.inputs.eval_rows)):
            return evaluate(self.engine, self.factory, self.inputs.eval_rows, r.temperature,
                            self.cfg.eval.samples_per_prompt, r.max_new_tokens,
                            self.eval_stop_ids, seed=self.cfg.seed + 7,
                            tokenizer=self.tokenizer,
                            limits=EpisodeLimits(r.max_turns, r.max_context_tokens),
                            group_reward=self.inputs.group_reward, resources=self.resources)


def build_run(cfg: Config, run_dir: Path, resume: bool, dataset=None, eval_dataset=None,
              reward=None, progress: bool = True, env=None,
              group_reward=None) -> tuple[Run, int]:
    """The run and its first step. The run holds its directory's lock (`run.lock`) until the
    caller releases it (api.train does, last); a lock never released ends with the process."""
    inputs = resolve_inputs(cfg, dataset, eval_dataset, reward, env, group_reward)
    check_model_path(cfg.model.path)  # before the run directory exists
    check_engine(cfg.rollout.engine, cfg.mode,  # the engine can do what the run asks of it
                 cfg.async_.inflight_updates)
    check_cluster(cfg.cluster)  # ray importable, its address answers (cluster/preflight.py)
    lock = take_run_dir(run_dir, cfg, resume)
    if cfg.observability.trace:  # this process's shard; started processes add theirs
        trace.start(run_dir / trace.TRACE_DIR, "trainer")
    try:
        run, start_step = _assemble(cfg, run_dir, resume, inputs, progress)
    except BaseException:  # the lock is released; the error goes on
        trace.stop()
        lock.release()
        raise
    run.lock = lock
    run.util = StepUtilisation(run_dir) if cfg.observability.trace else None
    return run, start_step


def take_run_dir(run_dir: Path, cfg: Config, resume: bool) -> runlock.RunLock:
    """prepare_run_dir under the run directory's lock (runs/lock.py): one process at a time reads
    and writes a run directory. A new path is checked and created by prepare_run_dir first
    (nothing locked, nothing written); the check is redone and config.json written only under the
    lock, so of two runs that make the same new folder at once, the second is refused.
    """
    if not run_dir.is_dir():
        prepare_run_dir(run_dir, cfg, resume, write=False)
    lock = runlock.acquire(run_dir)
    try:
        prepare_run_dir(run_dir, cfg, resume)
    except BaseException:
        lock.release()
        raise
    return lock


def _assemble(cfg: Config, run_dir: Path, resume: bool, inputs: Inputs,
              progress: bool) -> tuple[Run, int]:
    """Model, engine, trainer, then the wiring; if a later part fails, what was built is
    closed (an engine may own a server process, a trainer a teacher's worker)."""
    memory.huge_pages(cfg.huge_pages)  # before the first tensor: torch reads it once
    torch.set_num_threads(cfg.threads or os.cpu_count() or 1)
    torch.manual_seed(cfg.seed)
    random.seed(cfg.seed)
    dtype = torch.float32
    if cfg.lora.rank > 0:  # the frozen base as lora.base_dtype asks, before the engine's copy
        from traingym.trainer.lora import base_dtype  # heavy: transformers

        dtype = base_dtype(cfg.lora, cfg.trainer)
    model, tok = load_policy(cfg.model.path, seed=cfg.seed, dtype=dtype)
    engine, _ = build_engine(engine_context(cfg), model, tok)  # its own copy of the weights
    if cfg.lora.rank > 0:  # lora.sync='adapter': the engine merges adapters (trainer/lora.py)
        from traingym.trainer.lora import wrap_engine  # heavy: transformers

        engine = wrap_engine(cfg.lora, engine, model)  # may share the frozen base with it
    with ExitStack() as undo:
        undo.callback(engine.close)
        trainer = build_trainer(cfg, model, tok.pad_token_id)  # loop/trainer.py
        undo.callback(trainer.close)
        run, start_step = _wire(cfg, run_dir, resume, inputs, progress, tok, engine, trainer)
        undo.pop_all()  # built: the run closes them
    return run, start_step


def _wire(cfg, run_dir, resume, inputs, progress, tok, engine, trainer) -> tuple[Run, int]:
    factory = episode_factory(tok, cfg.task.prefill, cfg.task.system_prompt, inputs.env,
                              inputs.reward_fn)
    stop_ids = () if cfg.rollout.ignore_eos else stop_token_ids(tok)
    r = cfg.rollout
    params = SamplingParams(r.temperature, r.top_p, r.top_k, r.max_new_tokens, stop_ids)
    log = RunLog(run_dir, cfg.observability.samples_per_step,
                 Sinks(run_dir, cfg.observability, cfg.model_dump(mode="json"))
                 if cfg.observability.sinks else None, tok)
    start_step, position, state = 0, 0, {}
    if resume:
        saved = checkpoint.committed(run_dir / "checkpoints")
        if saved:
            state = checkpoint.load(saved[-1], trainer.model, trainer.optimizer,
                                    checkpoint.extra_modules(trainer))
            start_step, position = state["step"], state["data_position"]
        log.truncate_after(start_step)
    weights = ColocatedSync(engine, cfg.weights, engine_dtype(cfg.model.engine_dtype),
                            run_dir / "weights")
    weights.publish(trainer.export(), version=start_step)  # a new publisher: an anchor first
    resources = RunResources()  # this run's env resources, shared by its training and eval runners
    run = Run(cfg, run_dir, inputs, tok, trainer, engine, factory,
              RolloutRunner(engine, factory, params, r.group_size, tokenizer=tok,
                            limits=EpisodeLimits(r.max_turns, r.max_context_tokens),
                            group_reward=inputs.group_reward, resources=resources), weights,
              DataStream(inputs.train_rows, cfg.seed, position), log,
              Progress(cfg.steps, start_step, enabled=progress), stop_token_ids(tok),
              resumed=state, resources=resources)
    return run, start_step


def eval_report(before: dict | None, after: dict | None, metric: str) -> dict:
    report: dict = {"target_metric": metric}
    if before:
        report["before"] = as_dict(before)
    if after:
        report["after"] = as_dict(after)
    if before and after:
        report["delta"] = {k: paired_difference(after[k], before[k]) for k in after}
    return report
