"""`traingym serve`: an OpenAI-compatible HTTP API over a checkpoint or a model.

Layout: loading.py (a run's checkpoint, a run directory, an HF folder, 'embedded', 'tiny' ->
model, tokenizer, engine from the engine seam), protocol.py (request schemas), limits.py
(request limits, API key, the OpenAI error shape), text.py (chat rendering, tool calls, stop
strings, detokenizing, incremental text), continuous.py (continuous batching on engines with
step decoding: the built-in one), batching.py (dynamic batching: whole engine calls, for the
others), live.py (token-by-token SSE), responses.py (JSON bodies and SSE chunks of finished
completions), app.py (FastAPI routes), server.py (the command: host/key checks, uvicorn,
SIGTERM).

FastAPI and uvicorn are imported inside functions (the `serve` extra), so `import traingym`
stays light.
"""

from traingym.serve.server import add_parser, main  # noqa: F401
