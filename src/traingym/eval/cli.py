"""The `eval`, `runs` and `export` subcommands (cli.py adds their parsers and calls `run`).

    traingym eval [MODEL] [--set k=v ...] [--dataset rows.jsonl --reward mod:fn] [--out DIR]
    traingym eval --compare A B [--out DIR]      # eval folders or model specs, B - A paired
    traingym runs [DIR]                          # status, steps, last reward, held-out change
    traingym export CHECKPOINT OUT [--dtype bfloat16]

MODEL and A/B are specs as eval/specs.py reads them ('embedded', 'tiny', a model folder, a run
directory, a checkpoint folder; 'base' in a comparison). The eval config: --config/--preset if
given, else the run's own config when the model is (or, comparing, B or A is) part of a run,
else the default; --set overrides apply last. Module-level imports stay light (argparse only).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from traingym.runs.index import find_runs, table


def add_parsers(sub) -> None:
    e = sub.add_parser("eval", help="evaluate a model, checkpoint or endpoint on a task")
    e.add_argument("model", nargs="?", default=None,
                   help="'embedded' (default), 'tiny', a model folder, a run dir or checkpoint")
    e.add_argument("--compare", nargs=2, metavar=("A", "B"),
                   help="paired B - A over the same prompts (eval folders or model specs)")
    e.add_argument("--config", help="TOML, YAML or JSON config (default: the run's own)")
    e.add_argument("--preset", default=None, help="default | tiny (default: the run's config)")
    e.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config field, e.g. --set eval.num_prompts=64")
    e.add_argument("--dataset", help="eval rows (.jsonl); needs --reward or --env")
    e.add_argument("--reward", help="'module:function' scoring a Sample")
    e.add_argument("--env", help="'module:function' or 'module:Class' building an episode's Env")
    e.add_argument("--engine", help="rollout engine name (rollout/registry.py), e.g. openai")
    e.add_argument("--pass-k", default="1", help="comma-separated k for pass@k (default 1)")
    e.add_argument("--pass-threshold", type=float, default=1.0,
                   help="a sample passes when its reward >= this (default 1.0)")
    e.add_argument("--seed", type=int, help="eval seed (default: the config's seed + 7, the run's)")
    e.add_argument("--out", help="eval folder, new or empty (default: evals/eval-<time>)")
    e.add_argument("--allow-overlap", action="store_true",
                   help="evaluate even on training prompts of the run under test")
    r = sub.add_parser("runs", help="list runs: status, steps, reward, held-out change")
    r.add_argument("dir", nargs="?", default="runs", help="folder of runs (default: runs)")
    x = sub.add_parser("export", help="a checkpoint as a plain Hugging Face model folder")
    x.add_argument("checkpoint", help="RUN_DIR/checkpoints/step_N or a run directory (latest)")
    x.add_argument("out", help="new or empty output folder")
    x.add_argument("--dtype", default=None, help="float32 (as saved) | bfloat16 | float16")


def run(args: argparse.Namespace) -> int:
    return {"eval": _eval, "runs": _runs, "export": _export}[args.command](args)


def _pass_k(text: str) -> tuple[int, ...]:
    from traingym.core.errors import ConfigError  # heavy: pydantic

    try:
        ks = tuple(int(k) for k in text.split(",") if k.strip())
    except ValueError:
        raise ConfigError(f"--pass-k {text!r}: expected comma-separated integers, e.g. 1,4") \
            from None
    if not ks:
        raise ConfigError("--pass-k: give at least one k, e.g. --pass-k 1")
    return ks


def _config(args, run_dir: Path | None):
    """The eval config the flags ask for, or None (eval/run.py picks the run's or the default)."""
    from traingym.config.load import (  # heavy: pydantic, safetensors, torch
        _merge,
        build_config,
        parse_overrides,
        run_config_data,
        validate,
    )

    extra = list(args.overrides)
    extra += [f"task.{k}={getattr(args, k)}" for k in ("reward", "env") if getattr(args, k)]
    if args.engine:  # with the --set engine_options, validated together
        extra.append(f"rollout.engine={args.engine}")
    if args.config is None and args.preset is None and not extra:
        return None
    if args.config is not None or args.preset is not None or run_dir is None:
        return build_config(args.preset or "default", args.config, extra)
    return validate(_merge(run_config_data(run_dir), parse_overrides(extra)))


def _run_of(texts) -> Path | None:
    from traingym.eval.run import is_eval_folder  # heavy: pydantic, safetensors, torch
    from traingym.eval.specs import resolve_spec  # heavy: pydantic, safetensors, torch

    for text in texts:
        if text != "base" and not is_eval_folder(text):
            spec = resolve_spec(text)
            if spec.run_dir is not None:
                return spec.run_dir
    return None


def _eval(args) -> int:
    from traingym.core.errors import ConfigError  # heavy: pydantic
    from traingym.eval.run import (  # heavy: pydantic, safetensors, torch
        compare,
        evaluate,
        format_delta,
        format_scores,
    )

    out = Path(args.out or Path("evals") / f"eval-{time.strftime('%Y%m%d-%H%M%S')}")
    kw = dict(dataset=args.dataset, pass_k=_pass_k(args.pass_k),
              pass_threshold=args.pass_threshold, seed=args.seed,
              allow_overlap=args.allow_overlap)
    if args.compare:
        if args.model is not None:
            raise ConfigError("give either MODEL or --compare A B, not both")
        a, b = args.compare
        res = compare(a, b, out=out, config=_config(args, _run_of([b, a])), **kw)
        print(f"A {res['a']['spec']}: {format_scores(res['a_scores'])}")
        print(f"B {res['b']['spec']}: {format_scores(res['b_scores'])}")
        print(f"change B - A (paired over {res['num_prompts']} prompts): "
              f"{format_delta(res['delta'])}")
        print(f"comparison: {out / 'compare.json'}")
        return 0
    model = args.model or "embedded"
    res = evaluate(model, config=_config(args, _run_of([model])), out=out, **kw)
    s = res.summary
    print(f"{model} on {s['num_prompts']} prompts (engine {s['engine']}, seed {s['seed']}): "
          f"{format_scores({k: v.summary() for k, v in res.scores.items()})}")
    print(f"weights: {s['weights']}")
    print(f"eval folder: {out}")
    return 0


def _runs(args) -> int:
    from traingym.config.load import run_config  # heavy: pydantic, safetensors, torch

    runs = find_runs(args.dir, read_config=run_config)
    print(table(runs) if runs else f"no runs under {args.dir}")
    return 0


def _export(args) -> int:
    from traingym.eval.export import export  # heavy: pydantic

    print(f"exported: {export(args.checkpoint, args.out, args.dtype)}")
    return 0
