"""Command line: `traingym train [CONFIG] [--preset P] [--set k=v ...] [--run-dir D] [--resume]`.

Imports stay light at module level so `traingym --help` answers in well under a second.
"""

from __future__ import annotations

import argparse
import sys


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="traingym", description="RL post-training of language models")
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
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    from traingym.config import ConfigError, build_config

    try:
        cfg = build_config(args.preset, args.config, args.overrides)
    except ConfigError as e:
        print(f"traingym: {e}", file=sys.stderr)
        return 2
    if args.command == "config":
        print(cfg.model_dump_json(indent=1))
        return 0
    if args.resume and not args.run_dir:
        print("traingym: --resume needs --run-dir", file=sys.stderr)
        return 2
    from traingym.api import train
    from traingym.envs.datasets import DatasetError
    from traingym.envs.single_turn import RewardError

    try:
        result = train(cfg, run_dir=args.run_dir, resume=args.resume, progress=not args.quiet)
    except (ConfigError, DatasetError, FileExistsError, FileNotFoundError) as e:
        print(f"traingym: {e}", file=sys.stderr)
        return 2
    except RewardError as e:
        print(f"traingym: the run stopped: {e}", file=sys.stderr)
        return 1
    print(f"run directory: {result.run_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
