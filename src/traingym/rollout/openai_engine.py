"""Read-only rollout engine over an OpenAI-compatible completions server with log-probs (vLLM,
SGLang, hosted endpoints) for evaluation, judges, teachers and baselines. It takes no weights
(`update_weights` and `state_hash` raise, `version` is 0), so a training run refuses it.

Prompts go as token ids to /v1/completions (retries: rollout/http.py). dialect "vllm" adds top_k,
stop_token_ids, ignore_eos and ids back, and checks the server's tokenizer; "standard" sends
OpenAI's fields only and maps token strings to ids, raising TokenDrift on any mismatch.
Log-probs are the server's. The contract is log softmax(logits / T) before any top-k/top-p cut:
vLLM's "raw" mode meets it only at T = 1 or greedy, "processed" only without a cut; set
`server_logprobs` to the server's mode (other cases warn once). `score` works only at T = 1.
Not covered: chat completions, streaming, stop strings, beam search; `traingym serve` as a scorer.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import re
import warnings
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from traingym.core.types import Completion, GenerationRequest, SamplingParams
from traingym.models.token_strings import piece_ids
from traingym.rollout.base import EngineAbilities
from traingym.rollout.http import HttpClient, ServerRejected, split_base_url

PROBE_TEXT = "The answer is 42. Hello, world!"  # the tokenizer check's text
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def server_seed(seed: int) -> int:
    """traingym's 63-bit request seed folded to 31 bits: every server takes that range (vLLM
    adds the sample index to it for n > 1)."""
    return seed % (2**31 - 1)


class ReadOnlyEngine(RuntimeError):
    """This engine serves a server's own weights and takes none."""


class TokenDrift(RuntimeError):
    """Token strings from the server could not be mapped to ids exactly."""


class OpenAIEngine:
    """A read-only engine over an OpenAI-compatible completions endpoint (module docstring)."""

    class Options(BaseModel):
        model_config = ConfigDict(extra="forbid")
        base_url: str = Field(description="the server, e.g. 'http://127.0.0.1:8000/v1' ('/v1' "
                              "optional)")
        model: str | None = Field(None, description="the model's name on the server; None: "
                                  "the first that /v1/models lists")
        api_key_env: str | None = Field(None, description="name of the environment variable "
                                        "that holds the API key (never the key itself)")
        dialect: Literal["vllm", "standard"] = Field(
            "vllm", description="'vllm': send vLLM's extra fields (top_k, stop_token_ids, "
            "token ids back); 'standard': OpenAI's fields only")
        server_logprobs: Literal["raw", "processed"] = Field(
            "raw", description="what the server's log-probs are (vLLM --logprobs-mode "
            "raw_logprobs / processed_logprobs); see the module docstring")
        timeout_s: float = Field(300.0, gt=0, description="seconds one request may take")
        connect_timeout_s: float = Field(5.0, gt=0)
        health_timeout_s: float = Field(5.0, gt=0, description="seconds health() waits")
        max_concurrency: int = Field(8, ge=1, description="requests in flight at once (per "
                                     "event loop)")
        retries: int = Field(3, ge=0, description="retries of a failed connection or a 5xx "
                             "answer (never of a 4xx)")
        backoff_s: float = Field(0.5, ge=0, description="first retry delay; doubles each time")
        check_tokenizer: bool = Field(True, description="dialect 'vllm': compare the server's "
                                      "tokenizer with the run's at start-up")
        extra_body: dict[str, Any] = Field(default_factory=dict, description="fields added "
                                           "to every completions request (server-specific)")

        @field_validator("api_key_env")
        @classmethod
        def _env_name(cls, v: str | None) -> str | None:
            if v is not None and not ENV_NAME.match(v):
                raise ValueError("api_key_env is the NAME of an environment variable holding "
                                 "the key (e.g. 'OPENAI_API_KEY'), not the key itself")
            return v

        @field_validator("base_url")
        @classmethod
        def _url(cls, v: str) -> str:
            split_base_url(v)
            return v

    abilities = EngineAbilities(takes_weights=False, inflight_updates=False,
                                crosses_processes=True, scores_tokens=True,
                                scores_at_any_temperature=False)
    version = 0
    """Always 0: the server serves its own weights, which no traingym trainer publishes."""

    @classmethod
    def from_context(cls, ctx, model, tokenizer, options: Options) -> OpenAIEngine:
        """`model` is not used (the server has its own weights); `tokenizer` checks ids."""
        return cls(options, tokenizer)

    def __init__(self, options: Options, tokenizer=None):
        self.options, self.tokenizer = options, tokenizer
        self.between_steps = None
        self.root = split_base_url(options.base_url)
        headers = {}
        if options.api_key_env is not None:
            key = os.environ.get(options.api_key_env)
            if not key:
                raise ValueError(f"openai engine: api_key_env={options.api_key_env!r} names an "
                                 "environment variable that is unset or empty: export it")
            headers["Authorization"] = f"Bearer {key}"
        self.http = HttpClient(
            self.root, "openai engine", fix=f"start the server or fix engine_options.base_url "
            f"(now {options.base_url!r})", headers=headers, timeout_s=options.timeout_s,
            connect_timeout_s=options.connect_timeout_s, retries=options.retries,
            backoff_s=options.backoff_s, max_concurrency=options.max_concurrency)
        self._warned: set[str] = set()
        self._closed = False
        served = self.served_models()
        if options.model is None:
            if not served:
                raise ValueError(f"openai engine: {self.root}/v1/models lists no model; set "
                                 "engine_options.model")
            self.model = served[0]
        elif options.model not in served:
            raise ValueError(f"openai engine: {self.root} does not serve model "
                             f"{options.model!r}; it serves {served}: fix engine_options.model")
        else:
            self.model = options.model
        if options.dialect == "vllm" and options.check_tokenizer and tokenizer is not None:
            self._check_tokenizer()

    # -- server queries -------------------------------------------------------------------

    def served_models(self, timeout_s: float | None = None) -> list[str]:
        body = self.http.request_sync("GET", "/v1/models", timeout_s=timeout_s)
        return [m["id"] for m in body.get("data", [])]

    def _check_tokenizer(self) -> None:
        try:
            body = self.http.request_sync("POST", "/tokenize", {
                "model": self.model, "prompt": PROBE_TEXT, "add_special_tokens": False})
        except ServerRejected as e:
            raise ValueError(f"{e}; the tokenizer check needs vLLM's /tokenize: set "
                             "engine_options.check_tokenizer=false for another server") from e
        theirs = body.get("tokens")
        ours = self.tokenizer.encode(PROBE_TEXT, add_special_tokens=False)
        if theirs != ours:
            raise ValueError(f"openai engine: the server's tokenizer differs from the run's "
                             f"(probe {PROBE_TEXT!r}: server {theirs}, run {ours}); serve a "
                             "model with the same tokenizer as model.path")

    def health(self) -> dict:
        """{'ok', 'url', 'model', 'models' or 'error', request stats}: one /v1/models call
        with `health_timeout_s`, no retries."""
        out: dict[str, Any] = {"url": self.root, "model": self.model, "version": self.version,
                               "requests": self.http.stats.requests,
                               "retries": self.http.stats.retries,
                               "peak_in_flight": self.http.stats.peak_in_flight}
        try:
            body = self.http.request_sync("GET", "/v1/models", retries=0,
                                          timeout_s=self.options.health_timeout_s)
            models = [m["id"] for m in body.get("data", [])]
            out.update(ok=self.model in models, models=models)
        except Exception as e:  # health reports, never raises
            out.update(ok=False, error=f"{type(e).__name__}: {e}")
        return out

    # -- the engine protocol --------------------------------------------------------------

    def update_weights(self, state, version: int) -> None:
        raise ReadOnlyEngine(f"openai engine at {self.root} is read-only: an OpenAI-compatible "
                             "endpoint serves its own weights and takes no updates; train with "
                             "rollout.engine='torch', 'vllm' or 'sglang', and use this engine "
                             "for evaluation, judging or as a teacher")

    def state_hash(self) -> str:
        """Cannot be known: the OpenAI API gives no way to read a server's weights back."""
        raise ReadOnlyEngine(f"openai engine at {self.root}: the served weights cannot be "
                             "read over the OpenAI API, so their hash is unknown")

    def close(self) -> None:
        """Nothing to stop (the server is not ours); later generate calls raise."""
        self._closed = True

    async def generate(self, requests: list[GenerationRequest]) -> list[list[Completion]]:
        if self._closed:
            raise RuntimeError("openai engine: generate after close()")
        for i, r in enumerate(requests):
            if r.n < 1:
                raise ValueError(f"request {i}: n must be >= 1, got {r.n}")
            if not r.prompt_ids:
                raise ValueError(f"request {i}: empty prompt")
            if not all(isinstance(t, int) for t in r.prompt_ids):
                raise ValueError(f"request {i}: prompt_ids must be token ids (ints)")
        async with self.http.async_client() as client:
            return list(await asyncio.gather(*(self._one(client, r) for r in requests)))

    async def score(self, prompts: list[list[int]], completions: list[list[int]],
                    temperature: float) -> list[list[float]]:
        """rollout/base.py's `score` at T = 1 (module docstring), one request a row, at most
        `max_concurrency` in flight."""
        if self._closed:
            raise RuntimeError("openai engine: score after close()")
        if temperature > 0 and temperature != 1.0:
            raise ValueError(f"openai engine: a server scores given tokens under "
                             f"softmax(logits) only, not softmax(logits / {temperature:g}); "
                             "sample at rollout.temperature = 1, or score with an engine that "
                             "scales (torch, vllm)")
        if len(prompts) != len(completions) or not all(prompts):
            raise ValueError(f"score: {len(prompts)} prompts for {len(completions)} "
                             "completions; each row needs a non-empty prompt")
        async with self.http.async_client() as client:
            return list(await asyncio.gather(*(self._score_one(client, p, c)
                                               for p, c in zip(prompts, completions))))

    async def _score_one(self, client, prompt: list[int], completion: list[int]) -> list[float]:
        if not completion:
            return []
        url, ids = f"{self.root}/v1/completions", [*prompt, *completion]
        body: dict[str, Any] = {"model": self.model, "prompt": ids, "echo": True, "logprobs": 0,
                                "max_tokens": 0, "temperature": 1.0, "stream": False}
        if self.options.dialect == "vllm":
            body["return_tokens_as_token_ids"] = True
        body.update(self.options.extra_body)
        try:
            answer = await self.http.request(client, "POST", "/v1/completions", body)
        except ServerRejected as e:
            raise ServerRejected(f"{e} (the scoring request: echo=true, logprobs=0, "
                                 "max_tokens=0); this server cannot score given tokens: use "
                                 "vLLM's OpenAI server or another teacher engine (torch, vllm)",
                                 e.status) from e
        choices = answer.get("choices") or []
        lp = (choices[0].get("logprobs") or {}) if len(choices) == 1 else {}
        pieces, logprobs = lp.get("tokens"), lp.get("token_logprobs")
        if pieces is None or logprobs is None or not len(pieces) == len(logprobs) == len(ids):
            raise RuntimeError(f"openai engine: {url} did not echo the {len(ids)} tokens sent "
                               "with their log-probs (echo=true, logprobs=0, max_tokens=0): "
                               "this server cannot score given tokens (vLLM's OpenAI server "
                               "can)")
        echoed = self._ids(url, pieces, choices[0])
        if echoed != ids:
            raise TokenDrift(f"openai engine: {url} echoed token ids {echoed[:12]}... for the "
                             f"ids {ids[:12]}... it was sent")
        out = logprobs[len(prompt):]
        if any(x is None for x in out):
            raise RuntimeError(f"openai engine: {url} echoed a completion token without a "
                               "log-prob")
        return [float(x) for x in out]

    # -- one request ----------------------------------------------------------------------

    def _body(self, r: GenerationRequest, n: int) -> dict:
        p, vllm = r.params, self.options.dialect == "vllm"
        if p.top_k > 0 and not vllm:
            raise ValueError("openai engine: top_k > 0 but dialect 'standard' has no top_k; "
                             "use dialect 'vllm' or put the server's field in extra_body")
        self._warn_logprobs(p)
        body: dict[str, Any] = {
            "model": self.model, "prompt": list(r.prompt_ids), "n": n,
            "max_tokens": p.max_new_tokens, "temperature": p.temperature, "top_p": p.top_p,
            "seed": server_seed(r.seed), "logprobs": max(1, p.top_logprobs), "stream": False,
            "presence_penalty": 0.0, "frequency_penalty": 0.0,
        }
        if vllm:
            body.update(top_k=p.top_k if p.top_k > 0 else -1,
                        stop_token_ids=list(p.stop_token_ids), ignore_eos=True,
                        repetition_penalty=1.0, min_p=0.0, min_tokens=0,
                        return_tokens_as_token_ids=True, return_token_ids=True)
        body.update(self.options.extra_body)
        return body

    def _warn_logprobs(self, p: SamplingParams) -> None:
        if p.temperature == 0:
            return
        mode = self.options.server_logprobs
        if mode == "raw" and p.temperature != 1.0:
            case = (f"server_logprobs='raw' at T={p.temperature:g}: log-probs are of "
                    "softmax(logits), not softmax(logits/T)")
        elif mode == "processed" and (p.top_k > 0 or p.top_p < 1.0):
            case = (f"server_logprobs='processed' with top_k={p.top_k}, top_p={p.top_p:g}: "
                    "log-probs are after the cut, not before it")
        else:
            return
        if case not in self._warned:
            self._warned.add(case)
            warnings.warn(f"openai engine: {case} (rollout/openai_engine.py docstring)",
                          stacklevel=3)

    async def _one(self, client, r: GenerationRequest) -> list[Completion]:
        """One request. Greedy asks for one choice and repeats it n times (vLLM refuses n > 1
        when greedy; every greedy sample is the same anyway)."""
        url = f"{self.root}/v1/completions"
        n = 1 if r.params.temperature == 0 else r.n
        body = await self.http.request(client, "POST", "/v1/completions", self._body(r, n))
        choices = sorted(body.get("choices") or [], key=lambda c: c.get("index", 0))
        if len(choices) != n:
            raise RuntimeError(f"openai engine: {url} returned {len(choices)} choices for n={n}")
        comps = [self._completion(url, r, c) for c in choices]
        return comps if n == r.n else [dataclasses.replace(comps[0], token_ids=list(
            comps[0].token_ids), logprobs=list(comps[0].logprobs)) for _ in range(r.n)]

    def _completion(self, url: str, r: GenerationRequest, choice: dict) -> Completion:
        lp = choice.get("logprobs")
        if not lp or lp.get("token_logprobs") is None or lp.get("tokens") is None:
            raise RuntimeError(f"openai engine: {url} returned no log-probs although the "
                               "request asked for logprobs=1: this server cannot serve as a "
                               "traingym engine (use vLLM, or a server that returns log-probs)")
        pieces, logprobs = lp["tokens"], lp["token_logprobs"]
        if len(pieces) != len(logprobs) or any(x is None for x in logprobs):
            raise RuntimeError(f"openai engine: {url} returned {len(pieces)} tokens but "
                               f"log-probs {logprobs[:8]}...: each token needs one log-prob")
        ids = self._ids(url, pieces, choice)
        stops = set(r.params.stop_token_ids)
        cut = next((i + 1 for i, t in enumerate(ids) if t in stops), None)
        if cut is not None:  # client-side stop (dialect 'standard'; a no-op for vLLM)
            ids, logprobs = ids[:cut], logprobs[:cut]
        reason = choice.get("finish_reason")
        if cut is not None:
            finish = "stop"
        elif reason in ("stop", "length"):
            finish = reason
        else:
            raise RuntimeError(f"openai engine: {url} ended a completion with finish_reason "
                               f"{reason!r} (expected 'stop' or 'length')")
        comp = Completion(tuple(r.prompt_ids), ids, [float(x) for x in logprobs], finish,
                          self.version)
        if r.params.top_logprobs > 0:
            comp.top_logprobs = [self._top(url, d, r.params.top_logprobs)
                                 for d in (lp.get("top_logprobs") or [])[: len(ids)]]
            if len(comp.top_logprobs) != len(ids):
                raise RuntimeError(f"openai engine: {url} returned top log-probs for "
                                   f"{len(comp.top_logprobs)} of {len(ids)} tokens")
        return comp

    def _top(self, url: str, alternatives: dict[str, float] | None,
             k: int) -> list[tuple[int, float]]:
        """The k most likely (id, log-prob) of one step, most likely first (a server may add
        the sampled token as a (k+1)-th entry; it is dropped unless it is among the k)."""
        if not alternatives:
            raise RuntimeError(f"openai engine: {url} returned no top log-probs for a step")
        pairs = sorted(alternatives.items(), key=lambda kv: -kv[1])[:k]
        return [(self._piece_id(url, piece, -1), float(v)) for piece, v in pairs]

    def _ids(self, url: str, pieces: list[str], choice: dict) -> list[int]:
        if pieces and all(p.startswith("token_id:") for p in pieces):
            ids = [int(p[len("token_id:"):]) for p in pieces]
        else:
            ids = [self._piece_id(url, p, i) for i, p in enumerate(pieces)]
            self._check_text(url, ids, choice.get("text"))
        if choice.get("token_ids") is not None and choice["token_ids"] != ids:
            raise TokenDrift(f"openai engine: {url} returned token_ids {choice['token_ids']} "
                             f"but its log-probs name {ids}")
        return ids

    def _piece_id(self, url: str, piece: str, i: int) -> int:
        """One token string to its id: "token_id:N" (vLLM), or with the run's tokenizer, which
        must encode the string to exactly one id that decodes back to it (module doc)."""
        if piece.startswith("token_id:"):
            return int(piece[len("token_id:"):])
        tok = self.tokenizer
        if tok is None:
            raise TokenDrift(f"openai engine: {url} returns tokens as strings and the engine "
                             "has no tokenizer to map them; build it through rollout.registry.build")
        known = piece_ids(tok).get(piece)  # the one id written so (text, or bytes:\xNN)
        if known is not None:
            return known
        one = tok.encode(piece, add_special_tokens=False)
        if len(one) != 1 or tok.decode(one) != piece:
            where = f"token {i}" if i >= 0 else "a top log-prob token"
            raise TokenDrift(f"openai engine: {where} from {url}, {piece!r}, is not one token "
                             f"of the run's tokenizer (it encodes to {one}); the ids cannot be "
                             "recovered exactly: use a server that returns ids (vLLM: dialect "
                             "'vllm')")
        return one[0]

    def _check_text(self, url: str, ids: list[int], text: str | None) -> None:
        """Ids mapped from strings must decode to the text the server returned."""
        tok = self.tokenizer
        if text is not None and text not in (tok.decode(ids), tok.decode(
                ids, skip_special_tokens=True)):
            raise TokenDrift(f"openai engine: the ids mapped from {url}'s tokens decode to "
                             f"{tok.decode(ids)!r}, but the server's text is {text!r}")
