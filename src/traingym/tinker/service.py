"""What the routes call: sessions, training clients, samplers and checkpoints, over one
`Futures` worker. Methods that change a model return a request id at once (the work is queued
on the model's lane, in seq_id order); reads answer directly. Requests arrive validated by the
SDK's own pydantic types (app.py); what those cannot check (ids, limits, shapes) is checked
here, and a refusal found before queueing is an `ApiError` (4xx), one found while running a
failed future (category 'user'). The sampler calls are in samplers.py.
"""

from __future__ import annotations

import threading
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

from traingym.tinker import losses, store
from traingym.tinker.config import TinkerConfig
from traingym.tinker.errors import ApiError, not_found
from traingym.tinker.futures import Futures, UserError
from traingym.tinker.samplers import SamplerCalls
from traingym.tinker.sampling import Engines, RayEngines, Session
from traingym.tinker.store import KINDS
from traingym.tinker.training import Base, TrainingModel, load_base
from traingym.tinker.wire import forward_backward_output

KIND_NAMES = tuple(KINDS.values())  # 'training', 'sampler'


class Service(SamplerCalls):
    def __init__(self, cfg: TinkerConfig):
        self.cfg = cfg
        self.root = Path(cfg.runs_dir)
        self.futures = Futures(cfg.kept_results, cfg.max_pending)
        self.bases: dict[str, Base] = {}
        self.base_lock = threading.Lock()
        self.sessions: dict[str, dict] = {}
        self.models: dict[str, TrainingModel] = {}
        self.samplers: dict[str, Session] = {}
        if cfg.cluster.type == "ray":
            self.engines = RayEngines(cfg.engine_dtype, cfg.seed, cfg.cluster, cfg.weights,
                                      self.root / "_weights-engines")
        else:
            self.engines = Engines(cfg.engine_dtype, cfg.seed)

    # -- sessions and capabilities --------------------------------------------------------

    def capabilities(self) -> dict:
        return {"supported_models": [{"model_name": m, "trainable": True, "sampleable": True}
                                     for m in self.cfg.models]}

    def reap(self) -> None:
        """Close sessions whose heartbeats stopped (a client that died without close)."""
        cutoff = time.time() - self.cfg.session_timeout_s
        for sid, s in list(self.sessions.items()):
            if s["finished"] is None and s["seen"] < cutoff:
                self.finish(sid, {"type": "expired"})

    def create_session(self, req) -> dict:
        self.reap()
        sid = uuid.uuid4().hex
        self.sessions[sid] = {"created": time.time(), "seen": time.time(), "tags": req.tags,
                              "finished": None}
        return {"type": "create_session", "session_id": sid}

    def finish(self, sid: str, reason) -> None:
        """The session ends (ServiceClient.close): its training clients and samplers are
        dropped, their memory freed once queued work for them is done; checkpoints stay."""
        s = self.sessions[sid]
        s["finished"] = s["finished"] or reason or {"type": "closed"}
        for mid in [k for k in list(self.models) if k.startswith(f"{sid}:")]:
            self.models.pop(mid, None)
        for key in [k for k in list(self.samplers) if k.startswith(f"{sid}:")]:
            self.samplers.pop(key, None)
            for target in [t for t in list(self.futures.logs) if t[0] == key]:
                self.futures.drop_target(target)

    def session(self, sid: str) -> dict:
        if sid not in self.sessions:
            raise not_found("session", sid)
        s = self.sessions[sid]
        if s["finished"] is not None:
            raise ApiError(410, f"session {sid!r} is closed ({s['finished']}); start a new "
                           "ServiceClient", "session_closed")
        s["seen"] = time.time()
        return s

    def model(self, model_id: str) -> TrainingModel:
        if model_id not in self.models:
            raise not_found("training client (model_id)", model_id)
        return self.models[model_id]

    def _busy(self) -> None:
        if self.futures.busy():
            raise ApiError(429, f"{self.cfg.max_pending} requests are queued (max_pending); "
                           "retry shortly", "max_pending")

    # -- bases ---------------------------------------------------------------------------

    def check_base(self, name: str) -> None:
        if name in self.cfg.models:
            return
        if self.cfg.allow_local_folders and (Path(name).expanduser() / "config.json").is_file():
            return
        raise ApiError(400, f"base_model {name!r} is not served here; served: "
                       f"{self.cfg.models}", "unknown_model")

    def base(self, name: str) -> Base:
        """Loaded on first use (on the worker thread), then shared."""
        with self.base_lock:
            if name not in self.bases:
                self.bases[name] = load_base(name, self.root / "_tokenizers", self.cfg.seed)
            return self.bases[name]

    # -- training clients ----------------------------------------------------------------

    def _new_model_id(self, session_id: str, seq: int) -> str:
        self.session(session_id)
        model_id = f"{session_id}:train:{seq}"
        if model_id in self.models:
            raise ApiError(409, f"training client {model_id!r} exists (model_seq_id {seq} "
                           "used twice)", "exists")
        if len(self.models) >= self.cfg.max_training_clients:
            raise ApiError(429, f"{len(self.models)} training clients exist "
                           f"(max_training_clients)", "max_training_clients")
        return model_id

    def _lora(self, lora) -> dict | None:
        if lora is None:
            return None
        if not 1 <= lora.rank <= self.cfg.max_lora_rank:
            raise ApiError(400, f"lora rank {lora.rank}: must be 1..{self.cfg.max_lora_rank}",
                           "lora_rank")
        return {"rank": lora.rank, "seed": lora.seed, "train_attn": lora.train_attn,
                "train_mlp": lora.train_mlp, "train_unembed": lora.train_unembed}

    def _check_adam(self, optimizer_config) -> None:
        kind = getattr(optimizer_config, "type", "adamw")
        if kind != "adamw":
            raise ApiError(400, f"optimizer {kind!r}: only 'adamw' is supported", "optimizer")

    def create_model(self, req) -> str:
        self.check_base(req.base_model)
        self._check_adam(req.optimizer_config)
        lora = self._lora(req.lora_config)
        model_id = self._new_model_id(req.session_id, req.model_seq_id)
        self._busy()
        self.models[model_id] = None  # reserved: _ready answers 409 until it is built

        def run():
            try:
                m = TrainingModel(model_id, self.base(req.base_model), lora, self.cfg.lora_alpha,
                                  user_metadata=req.user_metadata,
                                  pass_tokens=self.cfg.pass_tokens)
            except Exception:
                self.models.pop(model_id, None)
                raise
            self.models[model_id] = m
            return {"model_id": model_id, "type": "create_model"}

        return self.futures.submit(run)

    def get_info(self, model_id: str) -> dict:
        m = self._ready(model_id)
        b = m.base
        return {"type": "get_info", "model_id": model_id, "is_lora": m.is_lora,
                "lora_rank": m.lora["rank"] if m.lora else None, "model_name": b.name,
                "model_data": {"arch": b.arch, "model_name": b.name,
                               "tokenizer_id": str(b.tokenizer_dir)}}

    def _ready(self, model_id: str) -> TrainingModel:
        m = self.model(model_id)
        if m is None:
            raise ApiError(409, f"training client {model_id!r} is still being created; retrieve "
                           "its create_model future first", "not_ready")
        return m

    def _refused(self, m: TrainingModel, seq: int | None, check) -> None:
        """Run `check`; when it refuses the request, its seq_id is still used up."""
        try:
            check()
        except ApiError:
            self.futures.skip(m.lane, seq)
            raise

    def _queue(self, model_id: str, seq: int | None, fn) -> str:
        m = self._ready(model_id)
        m.last_request = datetime.now(UTC).isoformat()
        self._busy()
        try:
            return self.futures.submit(fn, m.lane, seq)
        except UserError as e:
            raise ApiError(400, str(e), "seq_id") from None

    def forward_backward(self, req: dict) -> str:
        m = self._ready(req["model_id"])
        self._refused(m, req["seq_id"], lambda: self._check_data(m, req))
        return self._queue(req["model_id"], req["seq_id"],
                           lambda: forward_backward_output(*m.forward_backward(req)))

    def _check_data(self, m: TrainingModel, req: dict) -> None:
        cfg = self.cfg
        if not req["data"]:
            raise ApiError(400, "forward_backward: no data", "no_data")
        if len(req["data"]) > cfg.max_datums:
            raise ApiError(400, f"{len(req['data'])} datums in one request; the limit is "
                           f"{cfg.max_datums} (max_datums)", "max_datums")
        lengths = [len(t) for t, _ in req["data"]]
        limit = min(cfg.max_seq_tokens, m.base.max_context or cfg.max_seq_tokens)
        if max(lengths) > limit:
            raise ApiError(400, f"a datum of {max(lengths)} tokens; the limit is {limit}",
                           "max_seq_tokens")
        try:
            losses.check(req["loss_fn"], req["config"], [i for _, i in req["data"]], lengths)
        except UserError as e:
            raise ApiError(400, str(e), "loss_fn") from None
        vocab = m.model.get_input_embeddings().num_embeddings
        for i, (tokens, inputs) in enumerate(req["data"]):
            targets = inputs["target_tokens"]
            if min(tokens) < 0 or max(tokens) >= vocab or targets.min() < 0 \
                    or targets.max() >= vocab:
                raise ApiError(400, f"datum {i}: token ids outside [0, {vocab})", "token_ids")

    def optim_step(self, req) -> str:
        m = self._ready(req.model_id)
        params = req.optim_params

        def check():
            if getattr(params, "type", None) not in (None, "adamw") \
                    or not hasattr(params, "beta1"):
                raise ApiError(400, "optim_step: only AdamParams are supported", "optimizer")
            if not (params.learning_rate >= 0 and 0 <= params.beta1 < 1
                    and 0 <= params.beta2 < 1 and params.eps >= 0 and params.weight_decay >= 0):
                raise ApiError(400, "optim_step: AdamParams out of range (learning_rate, eps, "
                               "weight_decay >= 0; betas in [0, 1))", "adam_params")

        self._refused(m, req.seq_id, check)
        p = params.model_dump()
        return self._queue(req.model_id, req.seq_id,
                           lambda: {"metrics": m.optim_step(p), "type": "optim_step"})

    # -- checkpoints -----------------------------------------------------------------------

    def save_weights(self, req) -> str:
        m = self._ready(req.model_id)
        name = req.path or f"step-{m.steps:06d}-{uuid.uuid4().hex[:6]}"
        self._refused(m, req.seq_id, lambda: self._check_name(name))

        def run():
            path = store.save(self.root, req.model_id, "weights", name, m.trainable(), m.meta(),
                              m.optimizer, overwrite=req.overwrite)
            return {"path": path, "type": "save_weights"}

        return self._queue(req.model_id, req.seq_id, run)

    def _check_name(self, name: str) -> None:
        try:
            store.check_name(name)
        except UserError as e:
            raise ApiError(400, str(e), "path") from None

    def _checkpoint(self, path: str):
        try:
            return store.open_checkpoint(self.root, path)
        except UserError as e:
            raise ApiError(400 if "expected" in str(e) else 404, str(e), "path") from None

    def load_weights(self, req) -> str:
        into = self._ready(req.model_id) if req.model_id is not None else None
        found = []

        def check():
            found.extend(self._checkpoint(req.path))
            if found[0].parent.name != "weights" and req.optimizer:
                raise ApiError(400, f"{req.path} holds no optimizer state", "path")
            if into is not None and (into.base.name, into.lora) != (found[1]["base_model"],
                                                                    found[1]["lora"]):
                raise ApiError(400, f"{req.path} was saved from {found[1]['base_model']} with "
                               f"LoRA {found[1]['lora']}; this client is {into.base.name} with "
                               f"{into.lora}")

        if into is not None:
            self._refused(into, req.seq_id, check)
        else:
            check()
        folder, meta = found

        def restore(m: TrainingModel):
            m.load_trainable(store.load_tensors(folder))
            if req.optimizer:
                store.load_optimizer(folder, m.optimizer)
            m.steps = meta.get("steps", 0)

        if into is not None:  # into an existing training client, in its order
            def run_into():
                restore(into)
                return {"path": req.path, "model_id": req.model_id, "type": "load_weights"}

            return self._queue(req.model_id, req.seq_id, run_into)
        if req.session_id is None or req.model_seq_id is None:
            raise ApiError(400, "load_weights needs model_id, or session_id and model_seq_id")
        base_name = req.base_model or meta["base_model"]
        self.check_base(base_name)
        if req.optimizer_config is not None:
            self._check_adam(req.optimizer_config)
        model_id = self._new_model_id(req.session_id, req.model_seq_id)
        self._busy()
        self.models[model_id] = None

        def run_new():
            try:
                m = TrainingModel(model_id, self.base(base_name), meta["lora"],
                                  meta.get("lora_alpha", self.cfg.lora_alpha),
                                  user_metadata=req.user_metadata,
                                  pass_tokens=self.cfg.pass_tokens)
                restore(m)
            except Exception:
                self.models.pop(model_id, None)
                raise
            self.models[model_id] = m
            return {"path": req.path, "model_id": model_id, "type": "load_weights"}

        return self.futures.submit(run_new)

    def training_run(self, model_id: str) -> dict:
        """The SDK's TrainingRun for a live training client (its checkpoints from disk)."""
        m = self._ready(model_id)
        listed = self.checkpoints(model_id)["checkpoints"]
        last = {t: [c for c in listed if c["checkpoint_type"] == t] for t in KIND_NAMES}
        return {"training_run_id": model_id, "base_model": m.base.name, "model_owner": "local",
                "is_lora": m.is_lora, "lora_rank": m.lora["rank"] if m.lora else None,
                "last_request_time": m.last_request, "user_metadata": m.user_metadata,
                "last_checkpoint": (last["training"] or [None])[-1],
                "last_sampler_checkpoint": (last["sampler"] or [None])[-1]}

    def weights_info(self, path: str) -> dict:
        _, meta = self._checkpoint(path)
        lora = meta["lora"] or {}
        return {"base_model": meta["base_model"], "is_lora": bool(lora),
                "lora_rank": lora.get("rank"), "train_unembed": lora.get("train_unembed"),
                "train_mlp": lora.get("train_mlp"), "train_attn": lora.get("train_attn")}

    def delete_checkpoint(self, model_id: str, checkpoint_id: str) -> None:
        path = f"tinker://{model_id}/{checkpoint_id}"
        folder, _ = self._checkpoint(path)
        store.delete(folder)

    def checkpoints(self, model_id: str) -> dict:
        try:
            return {"checkpoints": store.listing(self.root, model_id)}
        except UserError as e:
            raise ApiError(400, str(e)) from None
