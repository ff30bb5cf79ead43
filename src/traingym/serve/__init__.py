"""`traingym serve`: an OpenAI-compatible HTTP API over a checkpoint or a model.

Layout: loading.py (a run's checkpoint, a run directory, an HF folder, 'embedded', 'tiny' ->
model, tokenizer, engine from the engine seam), protocol.py (request schemas), limits.py
(request limits, API key, the OpenAI error shape), text.py (chat rendering, tool calls, stop
strings, detokenizing), batching.py (the scheduler that batches concurrent requests onto the
engine), responses.py (JSON bodies and SSE chunks), app.py (FastAPI routes), server.py (the
command: host/key checks, uvicorn, SIGTERM).

FastAPI and uvicorn are imported inside functions (the `serve` extra), so `import traingym`
stays light.
"""

from traingym.serve.server import add_parser, main  # noqa: F401
