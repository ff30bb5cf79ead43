"""`traingym tinker [CONFIG] [--host H] [--port N] [--api-key-env VAR]`: serve the Tinker API.

Binds 127.0.0.1 unless `--host` says otherwise; a host that is not loopback also needs
`--api-key-env VAR`. Every request but healthz needs the key (`X-API-Key`, which the tinker SDK
sends from `api_key=` or $TINKER_API_KEY): from VAR when given, else a fresh `tml-...` key
printed at start (the SDK refuses keys without the `tml-` prefix).
"""

from __future__ import annotations

import os
import secrets
import signal
import sys


def add_parser(sub) -> None:
    s = sub.add_parser("tinker", help="serve the Tinker training API (the `tinker` SDK)")
    s.add_argument("config", nargs="?", help="TOML, YAML or JSON file with a [tinker] section")
    s.add_argument("--host", help="interface (default 127.0.0.1; another needs --api-key-env)")
    s.add_argument("--port", type=int, help="port (default 8100)")
    s.add_argument("--api-key-env", metavar="VAR", help="environment variable holding the "
                   "'tml-...' key clients must send; default: a key generated and printed")
    s.add_argument("--runs-dir", help="where checkpoints are written (default tinker_runs)")
    s.add_argument("--log-level", default="warning")


def load_config(path: str | None, args=None):
    from traingym.core.errors import ConfigError  # heavy: pydantic
    from traingym.tinker.config import TinkerConfig  # heavy: pydantic

    data: dict = {}
    if path:
        from traingym.config.load import load_file  # heavy: pydantic, torch (the sections)

        data = load_file(path)
        if "tinker" in data:  # beside it, the run config's sections the server reads
            data = {**{k: data[k] for k in ("cluster", "weights") if k in data},
                    **data["tinker"]}
    for flag in ("host", "port", "api_key_env", "runs_dir"):
        if args is not None and getattr(args, flag, None) is not None:
            data[flag] = getattr(args, flag)
    try:
        return TinkerConfig.model_validate(data)
    except Exception as e:  # pydantic's ValidationError: one line naming the fields
        raise ConfigError(f"tinker config: {e}") from None


def api_key(cfg) -> str:
    from traingym.core.errors import ConfigError  # heavy: pydantic

    loopback = cfg.host in ("localhost", "127.0.0.1", "::1")
    if cfg.api_key_env is None:
        if not loopback:
            raise ConfigError(f"--host {cfg.host} serves beyond this machine: put a key in an "
                              "environment variable and pass --api-key-env VAR")
        return "tml-" + secrets.token_urlsafe(32)
    key = os.environ.get(cfg.api_key_env, "")
    if not key.startswith("tml-"):
        raise ConfigError(f"--api-key-env {cfg.api_key_env}: the variable must hold a key "
                          "starting with 'tml-' (the tinker SDK refuses others)")
    return key


def main(args) -> int:
    from traingym.core.errors import ConfigError  # heavy: pydantic

    cfg = load_config(args.config, args)
    key = api_key(cfg)
    try:
        import uvicorn

        from traingym.tinker.app import Guard, build_app  # heavy: fastapi (the extra)
        from traingym.tinker.service import Service  # heavy: torch, transformers, peft
    except ModuleNotFoundError as e:
        raise ConfigError(f"traingym tinker needs {e.name}: pip install 'traingym[tinker]'") \
            from None
    app = Guard(build_app(Service(cfg), key), key, cfg.max_body_bytes)
    server = uvicorn.Server(uvicorn.Config(app, host=cfg.host, port=cfg.port,
                                           log_level=args.log_level, access_log=False))
    signal.signal(signal.SIGTERM, lambda *_: None)
    shown = key if cfg.api_key_env is None else f"${cfg.api_key_env}"
    print(f"traingym tinker: http://{cfg.host}:{cfg.port} (models {cfg.models}, checkpoints "
          f"in {cfg.runs_dir}); API key: {shown}", file=sys.stderr, flush=True)
    server.run()
    print("traingym tinker: stopped", file=sys.stderr, flush=True)
    return 0
