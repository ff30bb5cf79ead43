"""Samplers: a sampling session serves one fixed set of weights (a base model, a training
client's weights when it was saved, or a sampler checkpoint) through the built-in torch engine.

One engine per base model, built the project's way (rollout.registry.build from an
EngineContext, on the base model already loaded); a session's weights are pushed into it with
the engine's `update_weights` (the RolloutEngine protocol the colocated loop publishes
through) when a request of another session was served last, so sessions on one base share one
engine (and one extra copy of the base). A LoRA session keeps only a copy of its adapters; the
merged layers exist while the engine serves them. A model with tied input / output embeddings
is untied in the engine's copy, so an lm_head adapter (train_unembed) changes the head only.
With `cluster.type = "ray"` (`RayEngines`) each base's engine is a Ray actor instead
(cluster/ray_sampler.py), a session's weights published to it through weight sync.

Sampling follows SamplingParams: max_tokens (None: the server's max_tokens, within the
model's context), temperature (0: greedy), top_k (-1: none), top_p,
seed (none: a random one), stop (None: the tokenizer's EOS; token ids; strings, cut after the
first token whose text completes one; []: none). Sampled tokens include the stop token.
Sampled logprobs are under the sampling distribution (logits / temperature; raw logits when
greedy), as traingym's engines report them. prompt_logprobs are log softmax(logits) at
temperature 1, NaN for the first token (and for tokens before prompt_logprobs_last_n).
topk_sample_logprobs: the k most likely tokens at each sampled position, under the same
distribution. Refused (400): top-k prompt logprobs, target_prompt_logprobs,
prompt_alt_tokens_k, record_stability_info.
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from traingym.core.types import GenerationRequest, SamplingParams
from traingym.models.lora import delta
from traingym.models.scoring import row_logits, token_logprobs
from traingym.rollout.context import EngineContext
from traingym.rollout.registry import build
from traingym.tinker.futures import UserError
from traingym.tinker.training import Base

_UIDS = itertools.count()


@dataclass
class Weights:
    """What a sampler serves: tensors under the base's names (None: the base's own). The
    `inflight` sessions of one training client share one, which each inflight save updates."""

    state: dict[str, torch.Tensor] | None = None  # every tensor, or adapters (with a scale)
    scale: float | None = None  # alpha / r: `state` holds <module>.lora_{A,B}.weight
    version: int = 0
    uid: int = field(default_factory=lambda: next(_UIDS))  # never reused, unlike id()

    def tensors(self, base_state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Under the base's names: adapted layers merged as W + (alpha / r) B A in float32
        (models/lora.py's arithmetic, as the trainer merges), made when the engine needs
        them; or the full state as kept."""
        if self.scale is None or not self.state:
            return dict(self.state or {})
        out = {}
        for key, a in self.state.items():
            if key.endswith(".lora_A.weight"):
                module = key.removesuffix(".lora_A.weight")
                b = self.state[f"{module}.lora_B.weight"]
                out[f"{module}.weight"] = base_state[f"{module}.weight"].float() + \
                    delta(a, b, self.scale)
        return out


@dataclass
class Session:
    sampler_id: str
    base_name: str
    model_path: str | None = None
    base: Base | None = None
    weights: Weights | None = None
    prepare: Callable[[], tuple[Base, Weights]] | None = None  # run once, on the worker

    def ready(self) -> None:
        if self.prepare is not None:
            self.base, self.weights = self.prepare()
            self.prepare = None


class Engines:
    """One TorchEngine per base model, and which session's weights it holds now."""

    def __init__(self, dtype: str = "float32", seed: int = 0):
        self.dtype, self.seed = dtype, seed
        self.engines: dict[str, object] = {}
        self.holding: dict[str, tuple | None] = {}  # base name -> (weights uid, version)
        self.changed: dict[str, set[str]] = {}  # base name -> tensor names not the base's

    def engine_for(self, session: Session):
        session.ready()
        name = session.base.name
        if name not in self.engines:
            ctx = EngineContext(engine="torch", model=name, dtype=self.dtype, seed=self.seed)
            engine, _ = build(ctx, model=session.base.model, tokenizer=session.base.tokenizer)
            untie_head(engine)
            self.engines[name], self.holding[name], self.changed[name] = engine, None, set()
        engine = self.engines[name]
        held = (session.weights.uid, session.weights.version)
        if self.holding[name] != held:
            self._swap(engine, name, session)
            self.holding[name] = held
        return engine

    def generate(self, session: Session, requests: list[GenerationRequest]) -> list:
        return self.engine_for(session).generate_sync(requests)

    def prompt_logprobs(self, session: Session, prompt: list[int], last_n: int | None):
        return prompt_logprobs(self.engine_for(session), prompt, last_n)

    def close(self) -> None:
        """Nothing to release: the engines are this process's memory."""

    def _swap(self, engine, name: str, session: Session) -> None:
        """Push what differs between the engine's current weights and `session`'s: the
        session's own tensors, and the base's back where the last session changed them."""
        base_state = session.base.model.state_dict()
        new = session.weights.tensors(base_state)

        def is_base(k, v):
            return k in base_state and v.data_ptr() == base_state[k].data_ptr()

        changed = self.changed[name]
        push = {k: base_state[k] for k in changed if k not in new}
        push.update({k: v for k, v in new.items() if not is_base(k, v) or k in changed})
        engine.update_weights(push, version=engine.version + 1)
        self.changed[name] = {k for k, v in new.items() if not is_base(k, v)}


class RayEngines(Engines):
    """`cluster.type = "ray"`: each base model's engine is a Ray actor (cluster/ray_sampler.py)
    while the trainer stays in this process. A session's weights reach the actor through the
    weight-sync publisher (tcp, hash-verified; with the delta codec only what differs from the
    weights the actor holds crosses): the base's state with the session's tensors in place."""

    def __init__(self, dtype: str, seed: int, cluster, weights, scratch: Path):
        super().__init__(dtype, seed)
        self.cluster, self.weights, self.scratch = cluster, weights, scratch

    def engine_for(self, session: Session):
        from traingym.cluster.ray_sampler import RaySampler  # heavy: ray

        session.ready()
        name = session.base.name
        if name not in self.engines:
            ctx = EngineContext(engine="torch", model=name, dtype=self.dtype, seed=self.seed)
            self.engines[name] = RaySampler(ctx, self.cluster, self.weights,
                                            self.scratch / str(len(self.engines)), untie_head)
            self.holding[name] = None
        sampler = self.engines[name]
        held = (session.weights.uid, session.weights.version)
        if self.holding[name] != held:
            base_state = session.base.model.state_dict()
            sampler.publish({**base_state, **session.weights.tensors(base_state)})
            self.holding[name] = held
        return sampler

    def generate(self, session: Session, requests: list[GenerationRequest]) -> list:
        return self.engine_for(session).generate(requests)

    def prompt_logprobs(self, session: Session, prompt: list[int], last_n: int | None):
        return self.engine_for(session).call(prompt_logprobs, prompt, last_n)

    def close(self) -> None:
        for sampler in reversed(list(self.engines.values())):  # the first joined Ray: last
            sampler.close()
        self.engines.clear()


def untie_head(engine) -> None:
    """A model with tied input / output embeddings gets its own head in the engine's copy, so
    an lm_head adapter (train_unembed) changes the head only."""
    m = engine.model
    head, emb = m.get_output_embeddings(), m.get_input_embeddings()
    if head is not None and head.weight is emb.weight:
        head.weight = torch.nn.Parameter(head.weight.detach().clone(), requires_grad=False)
        m.config.tie_word_embeddings = False


def stop_ids(stop, tokenizer) -> tuple[tuple[int, ...], list[str]]:
    """(stop token ids, stop strings) from SamplingParams.stop."""
    if stop is None:
        eos = tokenizer.eos_token_id
        return ((eos,) if eos is not None else ()), []
    if isinstance(stop, str):
        return (), [stop]
    stop = list(stop)
    if all(isinstance(s, int) for s in stop):
        return tuple(stop), []
    if all(isinstance(s, str) for s in stop):
        return (), [s for s in stop if s]
    raise UserError("sampling_params.stop: a string, a list of strings or a list of token ids")


def _cut_at_string(tokens, logprobs, strings, tokenizer):
    """Cut after the first token whose decoded text completes a stop string."""
    for k in range(1, len(tokens) + 1):
        text = tokenizer.decode(tokens[:k])
        if any(s in text for s in strings):
            return tokens[:k], logprobs[:k], True
    return tokens, logprobs, False


def _request(session: Session, req: dict) -> tuple[GenerationRequest, list[str]]:
    """The engine request for one sample request, and its stop strings; UserError if it
    cannot run on this model."""
    tok, max_context = session.base.tokenizer, session.base.max_context
    prompt = req["prompt"]
    vocab = session.base.model.get_input_embeddings().num_embeddings
    if min(prompt) < 0 or max(prompt) >= vocab:
        raise UserError(f"prompt token ids outside [0, {vocab})")
    sp = req["sampling_params"]
    ids, strings = stop_ids(sp.get("stop"), tok)
    max_new = sp.get("max_tokens") or max(1, min(req["default_max_tokens"],
                                                  (max_context or 1 << 30) - len(prompt)))
    if max_context and len(prompt) + max_new > max_context:
        raise UserError(f"prompt ({len(prompt)} tokens) + max_tokens ({max_new}) exceeds the "
                        f"model's context of {max_context}")
    seed = sp.get("seed")
    params = SamplingParams(temperature=float(sp.get("temperature", 1.0)),
                            top_p=float(sp.get("top_p", 1.0)),
                            top_k=max(int(sp.get("top_k", -1)), 0), max_new_tokens=max_new,
                            stop_token_ids=ids, top_logprobs=req.get("topk_sample_logprobs", 0))
    return GenerationRequest(tuple(prompt), n=req["num_samples"], params=params,
                             seed=seed if seed is not None else random.getrandbits(62)), strings


def sample_many(engines: Engines, session: Session, reqs: list[dict]) -> list:
    """One engine call for several sample requests of one session (the engine batches those
    with equal sampling params); per request its (sequences [(stop_reason, tokens, logprobs,
    top-k)], prompt_logprobs or None), or the UserError that refused it alone."""
    session.ready()
    tok = session.base.tokenizer
    out: list = [None] * len(reqs)
    todo: list[tuple[int, GenerationRequest, list[str]]] = []
    for i, req in enumerate(reqs):
        try:
            todo.append((i, *_request(session, req)))
        except UserError as e:
            out[i] = e
    done = engines.generate(session, [gen for _, gen, _ in todo]) if todo else []
    for (i, _, strings), completions in zip(todo, done):
        sequences = []
        for c in completions:
            tokens, lps, reason = list(c.token_ids), list(c.logprobs), c.finish_reason
            if strings:
                tokens, lps, hit = _cut_at_string(tokens, lps, strings, tok)
                reason = "stop" if hit else reason
            top = c.top_logprobs[:len(tokens)] if c.top_logprobs is not None else None
            sequences.append((reason, tokens, lps, top))
        prompt_lps = None
        if reqs[i].get("prompt_logprobs"):
            prompt_lps = engines.prompt_logprobs(session, reqs[i]["prompt"],
                                                 reqs[i].get("prompt_logprobs_last_n"))
        out[i] = (sequences, prompt_lps)
    return out


@torch.no_grad()
def prompt_logprobs(engine, prompt: list[int], last_n: int | None) -> list[float]:
    if len(prompt) < 2:
        return [math.nan] * len(prompt)
    logits, comp, _ = row_logits(engine.model, [prompt[:1]], [prompt[1:]], engine.pad_token_id)
    out = [math.nan] + token_logprobs(logits, comp, 1.0)[0].tolist()
    if last_n is not None:
        out = [math.nan] * (len(out) - last_n) + out[len(out) - last_n:]
    return out
