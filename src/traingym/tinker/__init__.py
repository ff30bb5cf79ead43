"""`traingym tinker`: the Tinker training API (the `tinker` SDK's REST protocol) over traingym.

config.py (the `tinker` section), app.py (routes, key and body limit), errors.py (the 4xx
refusal), service.py (sessions, training clients, checkpoints), samplers.py (sampler calls),
futures.py (request ids, the worker, seq_id order), training.py (LoRA / full fine-tuning
clients on a shared base), losses.py (Tinker's losses over traingym's), sampling.py (sessions
on the torch engine), store.py (safetensors checkpoints), wire.py (the SDK's protobuf bodies),
server.py (the command). FastAPI, uvicorn and the SDK (`tinker`, for its request types and
protobuf schema) are imported inside functions (the `tinker` extra), so `import traingym`
stays light.
"""

from traingym.tinker.server import add_parser, main  # noqa: F401
