"""`traingym serve CHECKPOINT_OR_MODEL`: load, check the host and key, run uvicorn.

Binds 127.0.0.1 unless `--host` says otherwise; a host that is not loopback is refused
unless `--api-key-env VAR` names an environment variable holding the key (the key never
appears on the command line, where other users could read it in the process list). With a
key, every request needs `Authorization: Bearer <key>`, on loopback too.

SIGTERM (and Ctrl-C) shut down cleanly: uvicorn stops accepting connections, requests in
flight are answered (up to `--graceful-s`, after which their connections are closed), the
batcher finishes what is queued, the engine is closed, and the command exits 0.
"""

from __future__ import annotations

import ipaddress
import os
import signal
import sys

from traingym.serve.limits import Limits


def add_parser(sub) -> None:
    s = sub.add_parser("serve", help="OpenAI-compatible HTTP API over a checkpoint or model")
    s.add_argument("model", help="a run's checkpoint folder, a run directory (its newest "
                   "checkpoint), a Hugging Face model folder, 'embedded' or 'tiny'")
    s.add_argument("--host", default="127.0.0.1", help="interface (default 127.0.0.1; another "
                   "needs --api-key-env)")
    s.add_argument("--port", type=int, default=8000)
    s.add_argument("--api-key-env", metavar="VAR", help="environment variable holding the API "
                   "key every request must send as 'Authorization: Bearer <key>'")
    s.add_argument("--served-model-name", help="the model id clients use (default: the run "
                   "and checkpoint name, or the folder name)")
    s.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override the run's config, e.g. --set rollout.engine=vllm")
    s.add_argument("--max-tokens", type=int, default=1024, help="max_tokens limit per request")
    s.add_argument("--max-prompt-tokens", type=int, default=4096)
    s.add_argument("--max-concurrent", type=int, default=64,
                   help="requests answered at once; more get 429")
    s.add_argument("--max-n", type=int, default=16, help="completions per request")
    s.add_argument("--max-body-bytes", type=int, default=1 << 20)
    s.add_argument("--max-context", type=int, help="prompt + completion tokens allowed "
                   "(default: the model's max_position_embeddings; a RoPE model computes "
                   "longer positions, at whatever quality it has there)")
    s.add_argument("--graceful-s", type=float, default=30.0,
                   help="on SIGTERM, how long requests in flight may take to finish")
    s.add_argument("--log-level", default="warning")


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def api_key(host: str, env_var: str | None) -> str | None:
    """The key from `env_var`; ConfigError for a non-loopback host without one."""
    from traingym.core.errors import ConfigError  # heavy: pydantic

    if env_var is None:
        if not is_loopback(host):
            raise ConfigError(f"--host {host} serves beyond this machine, so it needs an API "
                              "key: put one in an environment variable and pass "
                              "--api-key-env VAR (or keep the default --host 127.0.0.1)")
        return None
    key = os.environ.get(env_var, "")
    if not key:
        raise ConfigError(f"--api-key-env {env_var}: that environment variable is not set or "
                          "is empty; export it with the key first")
    return key


def main(args) -> int:
    from traingym.core.errors import ConfigError  # heavy: pydantic

    key = api_key(args.host, args.api_key_env)  # before loading anything
    for flag in ("max_tokens", "max_prompt_tokens", "max_concurrent", "max_n", "max_body_bytes",
                 "max_context"):
        if getattr(args, flag) is not None and getattr(args, flag) < 1:
            raise ConfigError(f"--{flag.replace('_', '-')} must be >= 1")
    try:
        import uvicorn

        from traingym.serve.app import build_app  # heavy: pydantic
    except ModuleNotFoundError as e:
        raise ConfigError(f"traingym serve needs {e.name}: pip install 'traingym[serve]'") \
            from None
    from traingym.runs.checkpoint import CheckpointError  # heavy: safetensors, torch
    from traingym.serve.loading import load  # heavy: pydantic, safetensors, torch

    try:
        served = load(args.model, args.overrides, args.served_model_name)
    except CheckpointError as e:  # unfinished or altered: one line, exit 2, as a bad input
        raise ConfigError(f"cannot serve {args.model}: {e}") from None
    if args.max_context is not None:
        served.context_len = args.max_context
    limits = Limits(args.max_body_bytes, args.max_tokens, args.max_prompt_tokens,
                    args.max_concurrent, args.max_n)
    app = build_app(served, limits, key)
    config = uvicorn.Config(app, host=args.host, port=args.port, log_level=args.log_level,
                            timeout_graceful_shutdown=args.graceful_s, access_log=False)
    server = uvicorn.Server(config)
    # uvicorn re-raises the signal it caught after shutting down; with this handler in
    # place that re-raise is a no-op and the command returns 0.
    signal.signal(signal.SIGTERM, lambda *_: None)
    print(f"traingym serve: {served.source} as {served.name!r} on http://{args.host}:"
          f"{args.port}/v1 ({'API key required' if key else 'no API key'})",
          file=sys.stderr, flush=True)
    server.run()
    print("traingym serve: stopped", file=sys.stderr, flush=True)
    return 0
