"""One `traingym tinker` server for the tinker tests: the app in a thread (uvicorn) on a free
port, the tiny model, checkpoints under a temporary folder. In-process, so a test can also read
the server's own state (test_tinker_losses.py compares its gradients with traingym's loss code)."""

import socket
import threading
import time

import pytest
from prereq import require

KEY = "tml-test-key-0123456789"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Live:
    def __init__(self, service, url: str, folder: str):
        self.service, self.url, self.key, self.folder = service, url, KEY, folder

    def client(self):
        import tinker

        return tinker.ServiceClient(base_url=self.url, api_key=self.key)


def serve(service, port: int):
    """`service`'s app behind its key guard, served by uvicorn in a daemon thread on `port`;
    returns (server, thread) once it answers. Stop: server.should_exit = True; thread.join()."""
    import uvicorn

    from traingym.tinker.app import Guard, build_app

    app = Guard(build_app(service, KEY), KEY, service.cfg.max_body_bytes)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port,
                                           log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
        time.sleep(0.05)
    return server, thread


@pytest.fixture(scope="session")
def live(tmp_path_factory):
    require("tinker", "the Tinker server tests drive it through the tinker SDK")
    require("peft", "LoRA training clients need peft")
    from traingym.models.loader import tiny_model, tiny_tokenizer
    from traingym.tinker.config import TinkerConfig
    from traingym.tinker.service import Service

    folder = tmp_path_factory.mktemp("hf_model")  # a local Hugging Face folder as a base
    tok = tiny_tokenizer()
    tiny_model(tok, seed=1).save_pretrained(folder)
    tok.save_pretrained(folder)
    port = free_port()
    cfg = TinkerConfig(port=port, runs_dir=tmp_path_factory.mktemp("tinker_runs"),
                       models=["tiny", str(folder)], poll_s=2.0, max_body_bytes=1 << 20,
                       max_training_clients=64)
    service = Service(cfg)
    server, thread = serve(service, port)
    yield Live(service, f"http://127.0.0.1:{port}", str(folder))
    server.should_exit = True
    thread.join(10)


@pytest.fixture(scope="session")
def tokenizer():
    from traingym.models.loader import tiny_tokenizer

    return tiny_tokenizer()


def datum(tokens: list[int], **inputs):
    """A next-token datum: model_input tokens[:-1], target_tokens tokens[1:], plus `inputs`."""
    from tinker import types

    return types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]),
                       loss_fn_inputs={"target_tokens": tokens[1:], **inputs})
