"""Rollout engine over an SGLang server's native HTTP API (GPU only: the sglang wheels are CUDA).

It writes the run's starting weights (`model.engine_dtype`), config and tokenizer to a folder and
launches `sglang.launch_server` on it, or connects to `Options.url` (which must serve them). One
POST /generate per request, the prompt batched n times so the radix cache shares it. SGLang's
log-probs are traingym's contract (log softmax(logits / T) before top-k/top-p) unless
SGLANG_RETURN_ORIGINAL_LOGPROB is set; its `ignore_eos` also disables stop_token_ids, so with stop
tokens a completion may end at the model's own eos. `update_weights` writes safetensors, loads
them with /update_weights_from_disk and reads back `verify_readback` tensors' leading rows;
`state_hash()` is the hash of what was written and loaded (SGLang cannot return whole weights).
Not covered: /update_weights_from_tensor and _from_distributed (no disk round trip), in-flight
updates, LoRA; seeded samples repeat only with `--enable-deterministic-inference`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import shutil
import subprocess
import sys
import tempfile
import time
import weakref
from pathlib import Path

import torch
from pydantic import BaseModel, ConfigDict, Field

from traingym.core.precision import engine_dtype
from traingym.core.procs import NotHealthy, free_port, log_tail, stop_group, wait_healthy
from traingym.core.ties import alias_groups
from traingym.core.types import Completion, GenerationRequest
from traingym.rollout.base import EngineAbilities, EngineUnavailable
from traingym.rollout.http import HttpClient, split_base_url

DTYPES = {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32"}


def _alias_groups(state: dict[str, torch.Tensor]) -> list[list[str]]:
    """Names that share one tensor (tied weights), each group in sorted order."""
    return [g for g in alias_groups(state) if len(g) > 1]


def default_python() -> str:
    """$TRAINGYM_SGLANG_PYTHON, else the interpreter running traingym."""
    return os.environ.get("TRAINGYM_SGLANG_PYTHON") or sys.executable


class SGLangEngine:
    """Rollout engine over SGLang's native HTTP API (module docstring)."""

    class Options(BaseModel):
        model_config = ConfigDict(extra="forbid")
        python: str | None = Field(None, description="interpreter with sglang installed "
                                   "(default: $TRAINGYM_SGLANG_PYTHON, else the one running "
                                   "traingym)")
        url: str | None = Field(None, description="connect to this running server instead of "
                                "starting one (it must serve the run's starting weights)")
        host: str = Field("127.0.0.1", description="where a started server listens")
        port: int | None = Field(None, description="its port (default: a free one)")
        mem_fraction_static: float = Field(0.3, gt=0, lt=1, description="GPU memory fraction "
                                           "SGLang takes for weights and KV cache (the trainer "
                                           "shares the GPU)")
        extra_args: list[str] = Field(default_factory=list, description="more launch_server "
                                      "arguments, e.g. ['--attention-backend', 'triton']")
        env: dict[str, str] = Field(default_factory=dict, description="environment of the "
                                    "server process, on top of this one's")
        weights_dir: str | None = Field(None, description="where weight versions are written "
                                        "(default: a temporary folder removed on close)")
        start_timeout_s: float = Field(900.0, gt=0)
        timeout_s: float = Field(600.0, gt=0, description="seconds one request may take")
        max_concurrency: int = Field(64, ge=1, description="requests in flight at once")
        retries: int = Field(3, ge=0, description="retries of a failed connection or a 5xx")
        backoff_s: float = Field(0.5, ge=0)
        verify_readback: int = Field(2, ge=0, description="tensors whose leading rows are "
                                     "read back and compared after each update (0: none)")

    abilities = EngineAbilities(takes_weights=True, inflight_updates=False,
                                crosses_processes=True)

    @classmethod
    def from_context(cls, ctx, model, tokenizer, options: Options) -> SGLangEngine:

        # the dtype the run's weight sync sends (the run resolves model.engine_dtype the same way)
        return cls(model, tokenizer, options, engine_dtype(ctx.dtype), ctx.seed)

    def __init__(self, model, tokenizer, options: Options, dtype: torch.dtype = torch.bfloat16,
                 seed: int = 0):
        from traingym.weights.colocated import wire_state  # heavy: numpy, zstandard
        from traingym.weights.hashing import state_hash  # heavy: numpy

        self.options, self.dtype, self.tokenizer = options, dtype, tokenizer
        self.version, self.between_steps = 0, None
        self.update_times: list[dict] = []
        self.proc: subprocess.Popen | None = None
        own_dir = options.weights_dir is None
        self.dir = Path(tempfile.mkdtemp(prefix="traingym-sglang-") if own_dir
                        else options.weights_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self._finalizer = weakref.finalize(self, SGLangEngine._release, None, self.dir, own_dir)
        self.config_dir = self.dir / "base"
        own = model.state_dict()
        self.aliases = _alias_groups(own)
        state = wire_state(own, dtype)
        self._write(self.config_dir, state, model, tokenizer)
        self.hash, self.current = state_hash(state), self.config_dir
        if options.url is not None:
            self.base = split_base_url(options.url)
        else:
            port = options.port or free_port(options.host)
            self.base = f"http://{options.host}:{port}"
        self.http = HttpClient(self.base, "sglang engine", fix="start the SGLang server or fix "
                               "engine_options.url" if options.url else "see the server log at "
                               f"{self.dir / 'server.log'}", timeout_s=options.timeout_s,
                               retries=options.retries, backoff_s=options.backoff_s,
                               max_concurrency=options.max_concurrency)
        if options.url is None:
            self._launch(seed)
        self._readback(state, self.config_dir)

    # -- server ---------------------------------------------------------------------------

    def _write(self, folder: Path, state, model=None, tokenizer=None) -> None:
        from safetensors.torch import save_file

        folder.mkdir(parents=True, exist_ok=True)
        full = dict(state)
        for group in self.aliases:  # a tied tensor under every name (SGLang reads e.g.
            have = next((n for n in group if n in state), None)  # embed_tokens, not lm_head)
            for name in group:
                if have is not None and name not in full:
                    full[name] = state[have]
        seen: set[int] = set()
        out = {}
        for k, v in full.items():  # safetensors refuses tensors that share memory
            out[k] = v.clone().contiguous() if v.data_ptr() in seen else v.contiguous()
            seen.add(v.data_ptr())
        save_file(out, str(folder / "model.safetensors"))
        if model is not None:
            model.config.save_pretrained(folder)
            if getattr(model, "generation_config", None) is not None:
                model.generation_config.save_pretrained(folder)  # SGLang reads its eos ids
            if tokenizer is not None:
                tokenizer.save_pretrained(folder)
        else:
            shutil.copy(self.config_dir / "config.json", folder / "config.json")

    def _launch(self, seed: int) -> None:
        o = self.options
        python = o.python or default_python()
        port = self.base.rsplit(":", 1)[1]
        cmd = [python, "-m", "sglang.launch_server", "--model-path", str(self.config_dir),
               "--host", o.host, "--port", port, "--dtype", DTYPES[self.dtype],
               "--mem-fraction-static", str(o.mem_fraction_static), "--random-seed", str(seed),
               "--log-level", "warning", *o.extra_args]
        env = {**os.environ, "SGLANG_RETURN_ORIGINAL_LOGPROB": "false", **o.env}
        log = self.dir / "server.log"
        with open(log, "w") as f:
            self.proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env,
                                         start_new_session=True)
        self._finalizer.detach()
        self._finalizer = weakref.finalize(self, SGLangEngine._release, self.proc, self.dir,
                                           o.weights_dir is None)
        try:
            wait_healthy(self.base + "/health", self.proc, o.start_timeout_s, interval_s=1.0,
                         probe_s=5.0)
        except NotHealthy as e:
            if e.exited is not None:
                raise EngineUnavailable(f"sglang engine: the server exited with code "
                                        f"{e.exited} while starting ({' '.join(cmd)})"
                                        f"; its log ends:\n{self._log_tail()}") from None
            self.close()
            raise EngineUnavailable(f"sglang engine: the server did not answer /health "
                                    f"within {o.start_timeout_s:g} s (raise "
                                    f"engine_options.start_timeout_s); its log ends:\n"
                                    f"{self._log_tail()}") from None

    def _log_tail(self, chars: int = 3000) -> str:
        return log_tail(self.dir / "server.log", chars=chars)

    @staticmethod
    def _release(proc, folder: Path, remove: bool) -> None:
        stop_group(proc, 30.0, 10.0)  # the server's group: scheduler, detokenizer
        if remove:
            shutil.rmtree(folder, ignore_errors=True)

    # -- weights --------------------------------------------------------------------------

    def update_weights(self, state: dict[str, torch.Tensor], version: int) -> None:
        from traingym.weights.colocated import wire_state  # heavy: numpy, zstandard
        from traingym.weights.hashing import state_hash  # heavy: numpy

        state = wire_state(state, self.dtype)
        folder = self.dir / f"v{version}"
        t0 = time.perf_counter()
        self._write(folder, state)
        t1 = time.perf_counter()
        body = self.http.request_sync("POST", "/update_weights_from_disk", {
            "model_path": str(folder), "weight_version": str(version), "flush_cache": True,
            "abort_all_requests": False})
        t2 = time.perf_counter()
        if not body.get("success", False):
            raise RuntimeError(f"sglang engine: the server did not load version {version} from "
                               f"{folder}: {body.get('message')}")
        self._readback(state, folder)
        t3 = time.perf_counter()
        if self.current != self.config_dir:
            shutil.rmtree(self.current, ignore_errors=True)
        self.current, self.hash, self.version = folder, state_hash(state), version
        self.update_times.append({"version": version, "write_s": t1 - t0, "load_s": t2 - t1,
                                  "readback_s": t3 - t2, "bytes": sum(
                                      t.numel() * t.element_size() for t in state.values())})

    def _readback(self, state: dict[str, torch.Tensor], folder: Path) -> None:
        """Compare the leading rows of `verify_readback` tensors the server holds with `state`
        (the input embedding first, then the last name in sorted order, then the others;
        names under which a tied tensor is only an alias, such as lm_head, are not asked)."""
        alias = {n for g in self.aliases for n in g[:-1]} - {n for g in self.aliases
                                                             for n in g if "embed" in n}
        names = [n for n in sorted(state) if n not in alias]
        embed = [n for n in names + [n for g in self.aliases for n in g] if "embed_tokens" in n]
        pick = list(dict.fromkeys(embed[:1] + names[-1:] + names))[: self.options.verify_readback]
        for name in pick:
            got = self.http.request_sync("POST", "/get_weights_by_name",
                                         {"name": name, "truncate_size": 4})
            got_t = torch.tensor(got, dtype=torch.float32).flatten()
            src = state.get(name)
            if src is None:  # a tied name the wire sent under another name
                src = state[next(n for g in self.aliases if name in g for n in g if n in state)]
            want = src[:4].float().flatten()
            n = min(got_t.numel(), want.numel())
            if n == 0 or not torch.equal(got_t[:n], want[:n]):
                raise RuntimeError(f"sglang engine: the server's {name} does not hold the "
                                   f"weights written to {folder} (read back "
                                   f"{got_t[:4].tolist()}, wrote {want[:4].tolist()}); set "
                                   "engine_options.verify_readback=0 only if the server "
                                   "renames tensors")

    def state_hash(self) -> str:
        """Hash of the state last written and loaded by the server (module docstring)."""
        return self.hash

    # -- generation -----------------------------------------------------------------------

    async def generate(self, requests: list[GenerationRequest]) -> list[list[Completion]]:
        if self.proc is not None and self.proc.poll() is not None:
            raise EngineUnavailable(f"sglang engine: the server exited ({self.proc.returncode})"
                                    f"; its log ends:\n{self._log_tail()}")
        for i, r in enumerate(requests):
            if r.n < 1 or not r.prompt_ids:
                raise ValueError(f"request {i}: needs n >= 1 and a prompt (n={r.n})")
        async with self.http.async_client() as client:
            return list(await asyncio.gather(*(self._one(client, r) for r in requests)))

    async def _one(self, client, r: GenerationRequest) -> list[Completion]:
        p, n = r.params, (1 if r.params.temperature == 0 else r.n)
        params = [{"temperature": p.temperature, "top_p": p.top_p,
                   "top_k": p.top_k if p.top_k > 0 else -1, "max_new_tokens": p.max_new_tokens,
                   "stop_token_ids": list(p.stop_token_ids), "ignore_eos": not p.stop_token_ids,
                   "sampling_seed": (r.seed * 1_000_003 + k) % (2**31 - 1)} for k in range(n)]
        body = {"input_ids": [list(r.prompt_ids)] * n, "sampling_params": params,
                "return_logprob": True, "logprob_start_len": -1}
        if p.top_logprobs > 0:
            body["top_logprobs_num"] = p.top_logprobs
        out = await self.http.request(client, "POST", "/generate", body)
        if not isinstance(out, list) or len(out) != n:
            raise RuntimeError(f"sglang engine: {self.base}/generate returned "
                               f"{type(out).__name__} for a batch of {n}")
        comps = [self._completion(r, item) for item in out]
        return comps if n == r.n else [dataclasses.replace(comps[0], token_ids=list(
            comps[0].token_ids), logprobs=list(comps[0].logprobs)) for _ in range(r.n)]

    def _completion(self, r: GenerationRequest, item: dict) -> Completion:
        meta = item.get("meta_info") or {}
        steps = meta.get("output_token_logprobs")
        if steps is None:
            raise RuntimeError(f"sglang engine: {self.base}/generate returned no "
                               "output_token_logprobs although return_logprob was set")
        ids, lps = [int(s[1]) for s in steps], [float(s[0]) for s in steps]
        if item.get("output_ids") is not None and list(item["output_ids"]) != ids:
            raise RuntimeError(f"sglang engine: output_ids {item['output_ids']} differ from the "
                               f"ids of the log-probs {ids}")
        finish = (meta.get("finish_reason") or {}).get("type")
        if finish not in ("stop", "length"):
            raise RuntimeError(f"sglang engine: a completion ended with {meta.get('finish_reason')}"
                               " (expected stop or length)")
        comp = Completion(tuple(r.prompt_ids), ids, lps, finish, self.version)
        if r.params.top_logprobs > 0:
            comp.top_logprobs = [[(int(t[1]), float(t[0])) for t in step]
                                 for step in meta.get("output_top_logprobs") or []]
        return comp

    def health(self) -> dict:
        out = {"url": self.base, "version": self.version, "updates": len(self.update_times),
               "pid": self.proc.pid if self.proc else None}
        if self.proc is not None and self.proc.poll() is not None:
            return {**out, "ok": False, "error": f"server exited ({self.proc.returncode})"}
        try:
            self.http.request_sync("GET", "/health", timeout_s=5, retries=0)
            return {**out, "ok": True}
        except Exception as e:  # health reports, never raises
            return {**out, "ok": False, "error": f"{type(e).__name__}: {e}"}

    def close(self) -> None:
        """Stop a server this engine started and remove its weight folders; idempotent."""
        self._finalizer()
        self.proc = None
