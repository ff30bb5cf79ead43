"""`traingym serve`: an OpenAI-compatible HTTP API over a checkpoint or a model.

loading.py (what is served), protocol.py (request schemas), limits.py (limits, API key, error
shape), text.py (rendering, tool calls, stop strings), continuous.py / batching.py (continuous
batching with step decoding; dynamic batching otherwise), live.py and responses.py (SSE and
JSON bodies), app.py (routes), server.py (the command). FastAPI and uvicorn are imported inside
functions (the `serve` extra), so `import traingym` stays light.
"""

from traingym.serve.server import add_parser, main  # noqa: F401
