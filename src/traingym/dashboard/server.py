"""`traingym dashboard [RUNS_DIR]`: check the host and token, then run uvicorn.

Binds 127.0.0.1 unless `--host` says otherwise; a host that is not loopback is refused unless
`--token-file F` names a file holding the token (never on the command line, where other users
could read it in the process list). With a token, every request needs it (security.py), on
loopback too. SIGTERM and Ctrl-C stop the server cleanly (exit 0), as `traingym serve` does.
"""

from __future__ import annotations

import signal
import sys
from pathlib import Path

from traingym.dashboard import security
from traingym.dashboard.app import build_app

DEFAULT_PORT = 8265


def add_parser(sub) -> None:
    d = sub.add_parser("dashboard", help="read-only web dashboard over a folder of runs")
    d.add_argument("runs_dir", nargs="?", default="runs", metavar="RUNS_DIR",
                   help="the folder that holds run directories (or one run) (default: runs)")
    d.add_argument("--host", default="127.0.0.1",
                   help="interface (default 127.0.0.1; another needs --token-file)")
    d.add_argument("--port", type=int, default=DEFAULT_PORT)
    d.add_argument("--token-file", metavar="F", help="file holding the token every request "
                   "must carry (Authorization: Bearer T, or open /?token=T once)")
    d.add_argument("--allow-host", action="append", default=[], metavar="NAME",
                   help="another name clients use in the Host header (e.g. the machine's DNS "
                   "name); loopback names and --host are always allowed")
    d.add_argument("--log-level", default="warning")


def check(args) -> str | None:
    """The token (None without --token-file); security.StartError for what cannot start."""
    root = Path(args.runs_dir)
    if not root.is_dir():
        raise security.StartError(f"{root} is not a folder; give the folder that holds your "
                                  "runs (traingym train writes runs/<name> by default)")
    if not 0 < args.port < 65536:
        raise security.StartError(f"--port {args.port}: give a port in 1..65535")
    token = security.read_token(args.token_file) if args.token_file else None
    if token is None and not security.is_loopback(args.host):
        raise security.StartError(f"--host {args.host} serves beyond this machine, so it needs "
                                  "a token: put one in a file and pass --token-file F (or keep "
                                  "the default --host 127.0.0.1)")
    return token


def main(args) -> int:
    token = check(args)
    try:
        import uvicorn

    except ModuleNotFoundError as e:
        raise security.StartError(f"traingym dashboard needs {e.name}: pip install "
                                  "'traingym[dashboard]'") from None

    hosts = security.allowed_hosts(args.host, args.allow_host)
    app = build_app(args.runs_dir, token, hosts)
    config = uvicorn.Config(app, host=args.host, port=args.port, log_level=args.log_level,
                            access_log=False, server_header=False, timeout_graceful_shutdown=5)
    server = uvicorn.Server(config)
    # uvicorn re-raises the signal it caught after shutting down; with this handler in place
    # that re-raise is a no-op and the command returns 0.
    signal.signal(signal.SIGTERM, lambda *_: None)
    where = f"[{args.host}]" if ":" in args.host else args.host
    print(f"traingym dashboard: {Path(args.runs_dir).resolve()} on http://{where}:{args.port}/ "
          f"({'token required' if token else 'no token'})", file=sys.stderr, flush=True)
    server.run()
    print("traingym dashboard: stopped", file=sys.stderr, flush=True)
    return 0
