"""The `tinker` config section: what `traingym tinker` serves and the limits it keeps.

Read from the CONFIG file's `[tinker]` table (TOML, YAML or JSON), or the whole file when it
has no such table; command-line flags (--host, --port) override it. The file's `[cluster]` and
`[weights]` tables (the run config's sections, cluster/config.py, weights/config.py) say where
the sampling engines run: `cluster.type = "ray"` puts them in Ray actors, their weights sent
over `weights.transport` (tcp) with `weights.codec`.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, model_validator

from traingym.cluster.config import ClusterConfig

from traingym.core.errors import Strict
from traingym.weights import registry
from traingym.weights.config import WeightsConfig


class TinkerConfig(Strict):
    host: str = Field("127.0.0.1", description="interface; another than loopback needs "
                      "api_key_env")
    port: int = Field(8100, ge=0, le=65535)
    api_key_env: str | None = Field(None, description="environment variable holding the "
                                    "'tml-...' key clients send; unset: a key is generated "
                                    "and printed at start")
    runs_dir: Path = Field(Path("tinker_runs"), description="where checkpoints are written: "
                           "<runs_dir>/<training run>/{weights,sampler_weights}/<name>")
    models: list[str] = Field(["tiny", "embedded"], description="base models clients may "
                              "name: 'tiny', 'embedded' or local Hugging Face folders")
    allow_local_folders: bool = Field(False, description="also accept any local Hugging Face "
                                      "folder as base_model, beyond `models`")
    seed: int = Field(0, description="seed of the tiny model's weights")
    max_lora_rank: int = Field(128, ge=1)
    lora_alpha: float = Field(32.0, gt=0, description="LoRA alpha (scale alpha / rank)")
    engine_dtype: str = Field("float32", description="the sampling engine's dtype "
                              "('float32', 'bfloat16', 'auto')")
    max_body_bytes: int = Field(64 << 20, ge=1024, description="request body limit (a "
                                "forward_backward batch is one body)")
    max_datums: int = Field(1024, ge=1, description="datums per forward_backward request")
    max_seq_tokens: int = Field(4096, ge=1, description="tokens per datum or prompt")
    pass_tokens: int = Field(8192, ge=1, description="padded tokens per forward pass: a "
                             "forward_backward request is split into passes of at most this "
                             "many (rows x longest row); its logits are 4 x vocab bytes each")
    max_tokens: int = Field(1024, ge=1, description="max_tokens per sample")
    max_samples: int = Field(64, ge=1, description="num_samples per sample request")
    max_training_clients: int = Field(16, ge=1)
    max_pending: int = Field(1024, ge=1, description="requests queued at once; more get 429")
    kept_results: int = Field(4096, ge=16, description="finished futures kept for retrieval")
    session_timeout_s: float = Field(120.0, gt=0, description="a session with no heartbeat "
                                     "for this long (the SDK sends one every 10 s) is closed: "
                                     "its training clients and samplers are dropped")
    poll_s: float = Field(10.0, gt=0, description="how long retrieve_future waits for a "
                          "result before answering try_again")
    client_pyqwest: bool = Field(False, description="let SDK clients send over the pyqwest "
                                 "(Rust) HTTP transport (client config "
                                 "use_pyqwest_transport); off: httpx's own. On Python < 3.14 "
                                 "a pyqwest response that lands while the client's interpreter "
                                 "exits aborts it (SIGABRT), and the sampling poller's "
                                 "long-poll keeps one in flight until the client is closed")
    cluster: ClusterConfig = Field(default_factory=ClusterConfig, description="where the "
                                   "sampling engines run: local (this process) or ray (one "
                                   "actor per base model; the trainer stays here)")
    weights: WeightsConfig = Field(default_factory=WeightsConfig, description="with "
                                   "cluster.type='ray': how a sampling session's weights "
                                   "reach its engine actor (transport 'tcp', as in a run)")

    @model_validator(mode="after")
    def _ray_transport(self) -> TinkerConfig:
        if self.cluster.type == "ray" and not \
                registry.get(self.weights.transport).abilities.crosses_nodes:
            raise ValueError(f"cluster.type='ray': weights.transport={self.weights.transport!r}"
                             f" does not reach other nodes; set weights.transport to one of "
                             f"{registry.able('crosses_nodes')}")
        return self
