"""`traingym dashboard [RUNS_DIR]`: a read-only web app over a folder of run directories
(docs/dashboard.md is its API contract).

Layout: index.py (incremental in-memory indexes of events.jsonl and samples.jsonl), api.py
(what each API route answers: runs, run detail, events, series, samples, trace, compare,
evals), app.py (FastAPI routes, the page and its files), security.py (the request guard:
methods, paths, Host allow-list, token; security headers; masking secrets), server.py (the
command: host/token checks, uvicorn, SIGTERM), static/ (the page, its JS modules and the
vendored charting library).

FastAPI and uvicorn are imported inside functions (the `dashboard` extra), so
`import traingym` stays light.
"""

from traingym.dashboard.server import add_parser, main  # noqa: F401
