"""`traingym dashboard [RUNS_DIR]`: a read-only web app over a folder of run directories
(docs/dashboard.md is its API contract).

index.py (incremental indexes), api.py (what each route answers), app.py (routes and page),
security.py (the request guard), server.py (the command), static/ (the page). FastAPI and
uvicorn are imported inside functions (the `dashboard` extra), so `import traingym` stays light.
"""

from traingym.dashboard.server import add_parser, main  # noqa: F401
