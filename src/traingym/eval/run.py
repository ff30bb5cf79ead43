"""`traingym.evaluate(...)` and `traingym eval`: a model, checkpoint or endpoint on a task.

Repeats a run's held-out evaluation (loop/build.py Run.evaluate): greedy and sampled episodes of
every eval row with the run's limits and seed, reporting each mean reward with its standard
error over prompts and pass@k (envs/evaluate.py). The engine comes from the engine registry;
which model, config and rows are used is decided in eval/specs.py, which also refuses eval
prompts that were training prompts of the run under test. The output folder holds
samples.jsonl and summary.json. `compare(a, b)` gives B - A paired over prompts, with its
standard error, on the same rows.
Not covered: per-sample token log-probs in the records, evaluation sharded across engines,
pass@k over greedy samples (one sample: it is the greedy mean).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from traingym.config.load import as_config, run_config
from traingym.config.schema import Config
from traingym.core.errors import ConfigError
from traingym.envs.evaluate import (
    Score,
    collect,
    group_means,
    paired_difference,
    pass_at_k_score,
    z_text,
)
from traingym.envs.runner import EpisodeLimits
from traingym.eval.specs import (
    build_engine_for,
    check_overlap,
    eval_rows,
    make_factory,
    prompt_key,
    resolve_spec,
    weights_source,
)
from traingym.models.families import stop_token_ids
from traingym.models.spec import ModelSpec

SUMMARY, SAMPLES, COMPARE = "summary.json", "samples.jsonl", "compare.json"


@dataclass
class EvalResult:
    scores: dict[str, Score]  # "greedy", "sampled", "pass@k"...
    summary: dict
    records: list[dict] = field(repr=False, default_factory=list)
    out: Path | None = None


def _as_config(config, spec: ModelSpec) -> Config:
    """The eval config: the one given, else the spec's run's, else the default; model.path is
    the spec's model."""

    if config is None and spec.run_dir is not None:
        cfg = run_config(spec.run_dir)
    else:
        cfg = as_config(config)
    return cfg.model_copy(update={"model": cfg.model.model_copy(update={"path": spec.model_path})})


def check_out(out: Path | None) -> None:
    if out is not None and out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise FileExistsError(f"eval folder {out} is not empty; choose another --out (an eval "
                              "never overwrites one)")


def evaluate(model: str | Path | ModelSpec = "embedded", *, config=None, dataset=None,
             reward=None, env=None, group_reward=None, engine: str | None = None,
             engine_options: dict | None = None, pass_k: tuple[int, ...] = (1,),
             pass_threshold: float = 1.0, seed: int | None = None, out: str | Path | None = None,
             allow_overlap: bool = False) -> EvalResult:
    """Evaluate `model` (eval/specs.py: 'embedded', 'tiny', a model folder, a checkpoint or
    run directory) on `dataset` rows (a list or a .jsonl path; default: the config's eval
    rows) with `reward` or `env`; `engine`/`engine_options` override rollout.engine. Writes
    the eval folder when `out` is given."""
    spec = model if isinstance(model, ModelSpec) else resolve_spec(model)
    cfg = _as_config(config, spec)
    if engine is not None or engine_options is not None:
        r = cfg.rollout.model_copy(update={k: v for k, v in (("engine", engine), (
            "engine_options", engine_options)) if v is not None})
        cfg = cfg.model_copy(update={"rollout": r})
    out = Path(out) if out is not None else None
    check_out(out)
    rows = eval_rows(cfg, dataset)
    ks = sorted(set(pass_k))
    n = cfg.eval.samples_per_prompt
    if any(k < 1 or k > n for k in ks):
        raise ConfigError(f"pass@k for k={ks} needs 1 <= k <= eval.samples_per_prompt ({n}): "
                          f"raise eval.samples_per_prompt to >= {max(ks)} or lower k")
    overlap = check_overlap(rows, spec, allow_overlap)
    seed = cfg.seed + 7 if seed is None else seed
    threads = _threads(cfg)
    t0 = time.monotonic()
    try:
        eng, tok = build_engine_for(cfg, spec)
        try:
            factory, group = make_factory(cfg, tok, reward, env, group_reward,
                                          custom_rows=dataset is not None)
            groups = _run(cfg, eng, tok, factory, group, rows, seed)
        finally:
            eng.close()
    finally:
        import torch

        torch.set_num_threads(threads)
    passed = [[s.reward >= pass_threshold for s in g.samples if not s.drop_reason]
              for g in groups["sampled"]]
    scores = {name: group_means(gs) for name, gs in groups.items()}
    scores.update({f"pass@{k}": pass_at_k_score(passed, k) for k in ks})
    summary = {
        "model": spec.describe(), "engine": cfg.rollout.engine,
        "weights": weights_source(cfg, spec), "seed": seed,
        "num_prompts": len(rows), "samples_per_prompt": n, "temperature": cfg.rollout.temperature,
        "max_new_tokens": cfg.rollout.max_new_tokens, "pass_threshold": pass_threshold,
        "prompts_sha256": prompts_hash(rows), "overlap": overlap,
        "scores": {k: vars(v) for k, v in scores.items()},
        "seconds": time.monotonic() - t0, "config": cfg.model_dump(mode="json"),
    }
    records = [_record(mode, g, threshold=pass_threshold) for mode, gs in groups.items()
               for g in gs]
    records = [r for group_records in records for r in group_records]
    if out is not None:
        write_folder(out, summary, records)
    return EvalResult(scores, summary, records, out)


def _threads(cfg: Config) -> int:
    """Use the run's torch thread count (reductions may depend on it); return the old one."""
    import torch

    old = torch.get_num_threads()
    torch.set_num_threads(cfg.threads or os.cpu_count() or 1)
    return old


def _run(cfg: Config, engine, tok, factory, group, rows, seed) -> dict[str, list]:
    r = cfg.rollout
    out = {}
    for name, temp, k in (("greedy", 0.0, 1), ("sampled", r.temperature,
                                                cfg.eval.samples_per_prompt)):
        out[name] = collect(engine, factory, rows, temp, k, r.max_new_tokens,
                            stop_token_ids(tok), seed, tokenizer=tok,
                            limits=EpisodeLimits(r.max_turns, r.max_context_tokens),
                            group_reward=group)
    return out


def _record(mode: str, group, threshold: float) -> list[dict]:
    return [{"mode": mode, "prompt_index": group.index, "sample": j, "prompt": s.prompt_text,
             "completion": s.completion_text, "reward": s.reward,
             **({"dropped": s.drop_reason} if s.drop_reason else
                {"passed": s.reward >= threshold}), "finish_reason": s.finish_reason,
             "turns": s.turns, "prompt_ids": list(s.prompt_ids),
             "completion_ids": list(s.completion_ids), "example": s.example,
             "env_info": s.env_info}
            for j, s in enumerate(group.samples)]


def prompts_hash(rows: list[dict]) -> str:
    return hashlib.sha256("\n".join(prompt_key(r) for r in rows).encode()).hexdigest()


def write_folder(out: Path, summary: dict, records: list[dict]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    with open(out / SAMPLES, "w") as f:
        for rec in records:
            f.write(json.dumps(rec, default=str) + "\n")
    (out / SUMMARY).write_text(json.dumps(summary, indent=1, default=str))


def load_summary(folder: Path) -> dict:
    path = Path(folder) / SUMMARY
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise FileNotFoundError(f"{folder} is not an eval folder (no {SUMMARY})") from None
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path} is not valid JSON ({e.msg}); rerun that eval") from None


def is_eval_folder(text: str | Path) -> bool:
    return (Path(text) / SUMMARY).is_file()


def compare(a: str | Path, b: str | Path, *, out: str | Path | None = None, config=None,
            **kwargs: Any) -> dict:
    """B - A per metric, paired over prompts (module docstring). Specs that are not eval
    folders are evaluated with the eval config of B's run (else A's, else `config`); their
    eval folders go to OUT/a and OUT/b, the comparison to OUT/compare.json."""
    out = Path(out) if out is not None else None
    check_out(out)
    summaries = {}
    specs = {}
    for name, text in (("a", a), ("b", b)):
        if is_eval_folder(text):
            summaries[name] = load_summary(Path(text))
    if len(summaries) < 2:
        pending = {n: t for n, t in (("a", a), ("b", b)) if n not in summaries}
        plain = {n: resolve_spec(t) for n, t in pending.items() if str(t) != "base"}
        for n, t in pending.items():
            specs[n] = plain.get(n) or resolve_spec(t, other=next(
                (s for s in plain.values() if s.run_dir is not None), None))
        if config is None:
            run = next((specs[n] for n in ("b", "a") if n in specs and specs[n].run_dir), None)
            config = run_config(run.run_dir) if run is not None else None
        for n, spec in specs.items():
            res = evaluate(spec, config=config, out=out / n if out else None, **kwargs)
            summaries[n] = res.summary
    result = paired(summaries["a"], summaries["b"])
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / COMPARE).write_text(json.dumps(result, indent=1))
    return result


def paired(a: dict, b: dict) -> dict:
    """B - A per shared metric from two summaries over the same prompts ({'delta', 'se', 'z'}
    each, z None when the standard error is within float noise of zero: paired_difference)."""
    if a["prompts_sha256"] != b["prompts_sha256"]:
        raise ConfigError("the two evals are on different prompts (their prompt hashes differ): "
                          "a paired comparison needs the same rows; rerun one with the other's "
                          "config and dataset")
    delta = {}
    for metric in a["scores"]:
        if metric in b["scores"]:
            sa, sb = (Score(**s[metric]) for s in (a["scores"], b["scores"]))
            delta[metric] = paired_difference(sb, sa)
    return {"a": a["model"], "b": b["model"], "num_prompts": a["num_prompts"],
            "seeds": [a["seed"], b["seed"]],
            "a_scores": {k: Score(**v).summary() for k, v in a["scores"].items()},
            "b_scores": {k: Score(**v).summary() for k, v in b["scores"].items()},
            "delta": delta}


def format_scores(scores: dict) -> str:
    return "  ".join(f"{k} {v['mean']:.3f} ± {v['se']:.3f}" for k, v in scores.items())


def format_delta(delta: dict) -> str:
    return "  ".join(f"{k} {v['delta']:+.3f} ± {v['se']:.3f}{z_text(v)}"
                     for k, v in delta.items())
