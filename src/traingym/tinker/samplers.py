"""Sampler calls of the service (a mixin of service.Service): save_weights_for_sampler,
create_sampling_session, the sampler lookup, and asample with its limits and refusals. A
sampling session's weights are prepared on the worker before its first sample (sampling.py).
"""

from __future__ import annotations

import uuid

from traingym.tinker import store
from traingym.tinker.errors import ApiError, not_found
from traingym.tinker.sampling import Session, Weights, sample_many
from traingym.tinker.wire import sample_response


CLONE_IDS = 1_000_000_000  # the SDK's seq_id block per cloned SamplingClient


class SamplerCalls:

    def save_for_sampler(self, req) -> str:
        m = self._ready(req.model_id)

        def check():
            if req.path is not None:
                self._check_name(req.path)
            elif req.sampling_session_seq_id is None:
                raise ApiError(400, "save_weights_for_sampler needs path or "
                               "sampling_session_seq_id")

        self._refused(m, req.seq_id, check)

        def run():
            if req.path is not None:
                tensors = m.sampler_tensors()[0]
                path = store.save(self.root, req.model_id, "sampler_weights", req.path, tensors,
                                  m.meta())
                return {"path": path, "type": "save_weights_for_sampler"}
            sid = f"{req.model_id}:sample:{req.sampling_session_seq_id}:{uuid.uuid4().hex[:8]}"
            if req.kind == "inflight":  # one mutable target per client, updated in place
                if m.inflight is None:
                    m.inflight = Weights()
                m.inflight.state, m.inflight.scale = m.sampler_tensors()
                m.inflight.version += 1
                weights = m.inflight
            else:
                weights = Weights(*m.sampler_tensors())
            self.samplers[sid] = Session(sid, m.base.name, None, m.base, weights)
            return {"sampling_session_id": sid, "type": "save_weights_for_sampler"}

        return self._queue(req.model_id, req.seq_id, run)

    def create_sampling_session(self, req) -> dict:
        """The session's id at once; its weights are loaded on the worker before its first
        sample (a base model, or a checkpoint's weights: adapters or every tensor)."""
        self.session(req.session_id)
        sid = f"{req.session_id}:sample:{req.sampling_session_seq_id}"
        if sid in self.samplers:
            raise ApiError(409, f"sampling session {sid!r} exists (sampling_session_seq_id "
                           "used twice)", "exists")
        if req.model_path is None:
            if req.base_model is None:
                raise ApiError(400, "create_sampling_session needs model_path or base_model")
            self.check_base(req.base_model)
            name = req.base_model
            self.samplers[sid] = Session(sid, name,
                                         prepare=lambda: (self.base(name), Weights()))
            return {"type": "create_sampling_session", "sampling_session_id": sid}
        folder, meta = self._checkpoint(req.model_path)
        self.check_base(meta["base_model"])

        def prepare():
            lora = meta["lora"]
            scale = meta.get("lora_alpha", 32.0) / lora["rank"] if lora else None
            return self.base(meta["base_model"]), Weights(store.load_tensors(folder), scale)

        self.samplers[sid] = Session(sid, meta["base_model"], req.model_path, prepare=prepare)
        return {"type": "create_sampling_session", "sampling_session_id": sid}

    def sampler(self, sid: str) -> dict:
        if sid not in self.samplers:
            raise not_found("sampling session", sid)
        s = self.samplers[sid]
        return {"sampler_id": sid, "base_model": s.base_name, "model_path": s.model_path}

    def retrieve_futures(self, req) -> tuple:
        """The target's (sampling session, clone) completions after req.prev_cursor, long
        polled up to req.timeout (None: poll_s, capped at poll_s); see Futures.completions."""
        t = req.target
        if t.sampling_session_id not in self.samplers:
            raise not_found("sampling session", t.sampling_session_id)
        if t.cloned_sampler_id < 0 or req.prev_cursor < 0 or (req.timeout or 0) < 0:
            raise ApiError(400, "retrieve_futures: cloned_sampler_id, prev_cursor and timeout "
                           "must be >= 0", "invalid_request")
        if len(req.retrieved_request_ids) > self.cfg.kept_results:
            raise ApiError(400, f"retrieve_futures: {len(req.retrieved_request_ids)} "
                           f"retrieved_request_ids; at most {self.cfg.kept_results} "
                           "(kept_results)", "invalid_request")
        timeout = self.cfg.poll_s if req.timeout is None else min(req.timeout, self.cfg.poll_s)
        return (t.sampling_session_id, t.cloned_sampler_id), timeout

    def asample(self, req) -> dict:
        cfg = self.cfg
        if req.sampling_session_id is not None:
            if req.sampling_session_id not in self.samplers:
                raise not_found("sampling session", req.sampling_session_id)
            session = self.samplers[req.sampling_session_id]
        else:
            raise ApiError(400, "asample needs sampling_session_id (create_sampling_session "
                           "first)")
        refused = [k for k in ("topk_prompt_logprobs", "prompt_alt_tokens_k")
                   if getattr(req, k)]
        refused += [k for k in ("target_prompt_logprobs", "record_stability_info")
                    if getattr(req, k)]
        if refused:
            raise ApiError(400, f"not supported by this server: {refused}", "unsupported")
        prompt = req.prompt.to_ints() if all(c.type == "encoded_text"
                                             for c in req.prompt.chunks) else None
        if prompt is None:
            raise ApiError(400, "prompt: only token chunks (encoded_text) are supported")
        sp = req.sampling_params.model_dump()
        problems = []
        if not prompt or len(prompt) > cfg.max_seq_tokens:
            problems.append(f"prompt of {len(prompt)} tokens (1..{cfg.max_seq_tokens})")
        if session.base is not None:  # else checked on the worker, once the base is loaded
            vocab = session.base.model.get_input_embeddings().num_embeddings
            if any(t < 0 or t >= vocab for t in prompt):
                problems.append(f"prompt token ids outside [0, {vocab})")
        if not 1 <= req.num_samples <= cfg.max_samples:
            problems.append(f"num_samples {req.num_samples} (1..{cfg.max_samples})")
        if sp.get("max_tokens") is not None and not 1 <= sp["max_tokens"] <= cfg.max_tokens:
            problems.append(f"max_tokens {sp['max_tokens']} (1..{cfg.max_tokens})")
        if sp.get("temperature", 1) < 0 or not 0 < sp.get("top_p", 1) <= 1:
            problems.append("temperature must be >= 0 and top_p in (0, 1]")
        if req.prompt_logprobs_last_n is not None and not (
                req.prompt_logprobs and 1 <= req.prompt_logprobs_last_n < len(prompt)):
            problems.append("prompt_logprobs_last_n needs prompt_logprobs and 1..len(prompt)-1")
        if not 0 <= req.topk_sample_logprobs <= 20:
            problems.append(f"topk_sample_logprobs {req.topk_sample_logprobs} (0..20)")
        if problems:
            raise ApiError(400, "sample: " + "; ".join(problems), "sample")
        self._busy()
        job = {"prompt": prompt, "sampling_params": sp, "num_samples": req.num_samples,
               "default_max_tokens": cfg.max_tokens,
               "topk_sample_logprobs": req.topk_sample_logprobs,
               "prompt_logprobs": bool(req.prompt_logprobs),
               "prompt_logprobs_last_n": req.prompt_logprobs_last_n}

        def run_many(jobs: list[dict]) -> list:
            return [r if isinstance(r, Exception) else sample_response(*r)
                    for r in sample_many(self.engines, session, jobs)]

        target = (session.sampler_id, (req.seq_id or 0) // CLONE_IDS)  # its poller's
        rid = self.futures.submit_batched(("sample", session.sampler_id), job, run_many, target)
        return {"request_id": rid,
                "sample_sequence_ids": [f"{rid}:{i}" for i in range(req.num_samples)]}
