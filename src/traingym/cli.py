"""Command line: `traingym train [CONFIG] [--preset P] [--set k=v ...] [--run-dir D] [--resume]`,
`traingym config`; `traingym eval | runs | export` (eval/cli.py), `traingym plan` (plan/cli.py),
`traingym serve` (serve/), `traingym tinker` (tinker/), `traingym dashboard` (dashboard/),
`traingym report` (dashboard/report.py). Imports stay light at module level so that `--help`
answers fast.

An error in what the user gave (arguments, config, files, rows, reward/env specs, model path,
run directory) is one `traingym: ...` line on stderr and exit code 2, before any work starts
(mapped in `main`); a run that fails on its own exits 1; SIGTERM stops at the next step with a
checkpoint and exit code 143 (runs/preempt.py). Other exceptions keep their traceback.
Limit: the input-error types are caught around the whole run, so a FileNotFoundError or
FileExistsError raised by a bug mid-run also ends as one line and exit 2.
"""

from __future__ import annotations

import argparse
import sys

from traingym.dashboard import add_parser as add_dashboard
from traingym.dashboard import main as dashboard
from traingym.dashboard.report import add_parser as add_report
from traingym.dashboard.report import main as report
from traingym.envs.datasets import DatasetError
from traingym.envs.single_turn import RewardError
from traingym.eval import cli as eval_cli
from traingym.plan import cli as plan
from traingym.runs.preempt import EXIT_CODE, RunPreempted, resume_command
from traingym.serve import add_parser as add_serve
from traingym.serve import main as serve
from traingym.tinker import add_parser as add_tinker
from traingym.tinker import main as tinker


class _Parser(argparse.ArgumentParser):
    """argparse whose usage errors are one `traingym: ...` line and exit code 2 (not the usage
    dump); the subcommand parsers inherit it."""

    def error(self, message: str):
        self.exit(2, f"traingym: {message} (see `{self.prog} --help`)\n")


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="traingym", description="RL post-training of language models")
    sub = p.add_subparsers(dest="command", required=True)
    t = sub.add_parser("train", help="run RL training (the embedded default without a config)")
    t.add_argument("config", nargs="?", help="TOML, YAML or JSON config file")
    t.add_argument("--preset", default="default", help="default | tiny (a seconds-long smoke run)")
    t.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config field, e.g. --set steps=10 --set trainer.lr=1e-5")
    t.add_argument("--run-dir", help="run directory (default: runs/<task>-<time>)")
    t.add_argument("--resume", action="store_true", help="continue the run in --run-dir")
    t.add_argument("--quiet", action="store_true", help="no progress display")
    c = sub.add_parser("config", help="print the resolved config as JSON")
    c.add_argument("config", nargs="?")
    c.add_argument("--preset", default="default")
    c.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    plan.add_parser(sub)

    add_serve(sub)

    add_tinker(sub)

    add_dashboard(sub)

    add_report(sub)
    eval_cli.add_parsers(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    try:
        args = _parser().parse_args(argv)
    except SystemExit as e:  # --help (0), or a usage error _Parser.error reported (2)
        return e.code if isinstance(e.code, int) else 2
    if args.command == "dashboard":  # reads files only: started without torch's import time
        try:
            return dashboard(args)
        except (ValueError, FileNotFoundError) as e:  # ConfigError is a ValueError
            print(f"traingym: {' '.join(str(e).splitlines())}", file=sys.stderr)
            return 2
    from traingym.core.errors import ConfigError  # heavy: pydantic

    try:
        return _command(args)
    # The user's input cannot run: config (and reward/env specs, run-dir paths), rows, a
    # missing file or model folder, a run directory that holds another run (or is in use).
    except (ConfigError, DatasetError, FileExistsError, FileNotFoundError) as e:
        print(f"traingym: {' '.join(str(e).splitlines())}", file=sys.stderr)
        return 2
    except RunPreempted as e:  # SIGTERM: stopped at a step boundary, checkpoint committed
        again = resume_command(args.config, args.preset, args.overrides, e.run_dir, args.quiet)
        print(f"traingym: stopped by {e.signal_name} after step {e.step}; resume with: {again}",
              file=sys.stderr)
        return EXIT_CODE  # 143 = 128 + SIGTERM
    except RewardError as e:  # the run itself failed; the sample follows on its own lines
        print(f"traingym: the run stopped: {e}", file=sys.stderr)
        return 1


def _command(args: argparse.Namespace) -> int:
    if args.command == "tinker":  # imports what it serves with, once its config is read
        return tinker(args)
    from traingym.config.load import build_config  # heavy: pydantic, safetensors, torch
    from traingym.core.errors import ConfigError  # heavy: pydantic

    if args.command == "plan":
        return plan.run(args)
    if args.command == "serve":
        return serve(args)
    if args.command == "report":
        return report(args)
    if args.command in ("eval", "runs", "export"):
        return eval_cli.run(args)
    if getattr(args, "resume", False) and not args.run_dir:
        raise ConfigError("--resume needs --run-dir (the folder of the run to continue)")
    cfg = build_config(args.preset, args.config, args.overrides)
    if args.command == "config":
        print(cfg.model_dump_json(indent=1))
        return 0
    from traingym.api import train  # heavy: numpy, pydantic, safetensors, torch, zstandard

    result = train(cfg, run_dir=args.run_dir, resume=args.resume, progress=not args.quiet)
    print(f"run directory: {result.run_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
