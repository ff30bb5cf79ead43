"""vLLM as a rollout engine: one vLLM instance in its own process and its own venv.

`VLLMEngine` runs rollout/vllm_worker.py with the vLLM venv's python (`scripts/setup_vllm.sh`: its
pins conflict with traingym's, hence the process boundary) and talks to it over two pipes, one JSON
message per line, never pickles. The engine's work folder holds the served model (config, tokenizer,
one `model.safetensors`) and `worker.log`, and is removed on `close()`.
`update_weights` writes the verified state as `model.safetensors` with every tied name filled in
(vLLM reads names the wire may skip) and has the worker reload it in place; vLLM on a CPU repacks
weights, so `state_hash` is of the state last loaded, not read back.
Log-probs follow traingym's contract (log softmax(logits / T) before any top-k/top-p cut) through
the worker's hooks, for sampling and for `score` alike (rollout/vllm_worker.py); seeds are per
request (sample i: seed + i).
Mixture-of-experts models (Qwen3-MoE, Mixtral; Qwen2-MoE untested) are written in their
checkpoint layout (`_disk_layout`), and the worker repacks the CPU MoE kernel's experts after
each reload (vllm_worker.py `traingym_repack_moe`); vLLM reports no routes
(abilities.reports_routes).
Not covered: in-flight weight updates, stop strings, tensor parallelism, several vLLM instances
behind one engine (run one engine per instance).
"""

from __future__ import annotations

import asyncio
import copy
import json
import os
import select
import shutil
import subprocess
import tempfile
import threading
import time
import weakref
from pathlib import Path
from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict, Field

from traingym.core.precision import engine_dtype
from traingym.core.procs import log_tail, stop_group
from traingym.core.ties import alias_groups
from traingym.core.types import Completion, GenerationRequest
from traingym.rollout.base import EngineAbilities, EngineUnavailable

WORKER = Path(__file__).with_name("vllm_worker.py")
SETUP = "bash scripts/setup_vllm.sh"


def default_python() -> Path:
    """$TRAINGYM_VLLM_PYTHON, else `.venv-vllm/bin/python` in the repository root (an editable
    install's checkout), else in the current folder."""
    if os.environ.get("TRAINGYM_VLLM_PYTHON"):
        return Path(os.environ["TRAINGYM_VLLM_PYTHON"])
    venv = Path(".venv-vllm") / "bin" / "python"
    repo = Path(__file__).resolve().parents[3] / venv
    return repo if repo.is_file() or not venv.is_file() else venv.absolute()


class VLLMEngine:
    """Rollout engine over a vLLM worker process (see the module docstring)."""

    class Options(BaseModel):
        model_config = ConfigDict(extra="forbid")
        python: str | None = Field(None, description="the vLLM venv's interpreter (default "
                                   "$TRAINGYM_VLLM_PYTHON or <repo>/.venv-vllm/bin/python)")
        dtype: Literal["auto", "bfloat16", "float32"] = Field(
            "auto", description="must match model.engine_dtype (the dtype weights arrive in); "
            "'auto' takes it from there")
        max_model_len: int | None = Field(None, ge=16, description="prompt + completion "
                                          "tokens; None: 1024 or the model's maximum if less")
        kv_cache_gb: float | None = Field(None, gt=0, description="KV cache size; None: 0.5 "
                                          "GiB without CUDA, else gpu_memory_utilization")
        gpu_memory_utilization: float = Field(0.3, gt=0, le=1, description="vLLM's fraction of "
                                              "device memory (a CPU: of NUMA node 0's memory)")
        enforce_eager: bool = True
        cpu_threads: int | None = Field(None, ge=1, description="the worker's OMP_NUM_THREADS "
                                        "on a CPU (None: the cores this process may use)")
        cpu_bind: str = Field("nobind", description="VLLM_CPU_OMP_THREADS_BIND: 'nobind' lets "
                              "the OS place the threads; a core list ('0-1') pins them (and "
                              "sets their number), which was several times slower here when "
                              "other processes shared those cores")
        start_timeout_s: float = Field(600.0, gt=0)
        request_timeout_s: float = Field(1800.0, gt=0)
        work_dir: str | None = Field(None, description="a fresh folder is made inside it "
                                     "(default: the system temp folder)")

    abilities = EngineAbilities(takes_weights=True, inflight_updates=False,
                                crosses_processes=True, scores_tokens=True,
                                scores_at_any_temperature=True)

    @classmethod
    def from_context(cls, ctx, model, tokenizer, options: Options) -> VLLMEngine:
        """Save `model` (in `ctx.dtype`: model.engine_dtype) and `tokenizer` to a work folder;
        start the worker on it and wait until it serves."""
        dtype = engine_dtype(ctx.dtype)
        if options.dtype != "auto" and getattr(torch, options.dtype) != dtype:
            raise ValueError(f"rollout.engine_options.dtype={options.dtype!r} but "
                             f"model.engine_dtype resolves to {dtype}: the trainer sends "
                             "weights in model.engine_dtype; set that instead")
        return cls(model, tokenizer, dtype, options)

    def __init__(self, model, tokenizer, dtype: torch.dtype, options: Options) -> None:
        self.options, self.dtype = options, dtype
        self.version = 0
        self.between_steps = None
        self._lock = threading.Lock()
        self._closed = False
        self.python = Path(options.python) if options.python else default_python()
        if not self.python.is_file():  # before anything is written
            raise EngineUnavailable(
                f"vllm engine: no interpreter at {self.python}. Fix: run `{SETUP}` (makes "
                ".venv-vllm), or point rollout.engine_options.python or $TRAINGYM_VLLM_PYTHON "
                "at a python that has vllm installed")
        parent = Path(options.work_dir) if options.work_dir else None
        if parent:
            parent.mkdir(parents=True, exist_ok=True)
        self.work_dir = Path(tempfile.mkdtemp(prefix="traingym-vllm-", dir=parent))
        self.model_dir, self.log_path = self.work_dir / "model", self.work_dir / "worker.log"
        self.proc: subprocess.Popen | None = None
        self._finalizer = weakref.finalize(self, _stop, None, self.work_dir)
        try:
            self.aliases = _aliases(model.state_dict())
            self._disk_layout = _disk_layout(model)
            config = copy.deepcopy(model.config)
            config.dtype = dtype  # what the folder holds
            config.architectures = [type(model).__name__]  # vLLM picks its model class by it
            limit = getattr(config, "max_position_embeddings", None) or 1024
            self.max_model_len = options.max_model_len or min(1024, limit)
            config.save_pretrained(self.model_dir)
            tokenizer.save_pretrained(self.model_dir)
            self._write(model.state_dict())
            self._start()
        except BaseException:
            self.close()
            raise

    # --- the worker process -------------------------------------------------------------

    def _start(self) -> None:
        o = self.options
        kv = o.kv_cache_gb if o.kv_cache_gb else (None if torch.cuda.is_available() else 0.5)
        args = [str(self.python), str(WORKER), "--model", str(self.model_dir),
                "--owned-dir", str(self.work_dir),
                "--dtype", str(self.dtype).removeprefix("torch."),
                "--max-model-len", str(self.max_model_len),
                "--gpu-memory-utilization", str(o.gpu_memory_utilization)]
        args += ["--kv-cache-bytes", str(int(kv * (1 << 30)))] if kv else []
        args += ["--enforce-eager"] if o.enforce_eager else []
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        env["OMP_NUM_THREADS"] = str(o.cpu_threads or len(os.sched_getaffinity(0)))
        env["VLLM_CPU_OMP_THREADS_BIND"] = o.cpu_bind
        env["VLLM_CPU_NUM_OF_RESERVED_CPU"] = "0"
        env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # one process: nothing else to clean up
        to_worker, from_worker = os.pipe(), os.pipe()
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                args + ["--fd-in", str(to_worker[0]), "--fd-out", str(from_worker[1])],
                pass_fds=(to_worker[0], from_worker[1]), stdin=subprocess.DEVNULL, stdout=log,
                stderr=subprocess.STDOUT, env=env, start_new_session=True)
        os.close(to_worker[0])
        os.close(from_worker[1])
        self._out, self._in, self._buf = to_worker[1], from_worker[0], b""
        self._finalizer.detach()
        self._finalizer = weakref.finalize(self, _stop, self.proc, self.work_dir)
        ready = self._read(time.monotonic() + o.start_timeout_s, "starting")
        self.pre_cut_logprobs = bool(ready.get("pre_cut_logprobs"))
        self.scaled_scores = bool(ready.get("scaled_scores"))
        self.vllm_version = ready.get("vllm")

    def _read(self, deadline: float, doing: str) -> dict:
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:  # a late answer would be taken for the next one's: stop the worker
                _stop(self.proc, None)
                raise self._unavailable(f"no answer within its timeout while {doing} (the "
                                        "worker was stopped)")
            ready, _, _ = select.select([self._in], [], [], min(left, 1.0))
            if not ready:
                continue
            chunk = os.read(self._in, 1 << 20)
            if not chunk:
                self.proc.wait(timeout=10)
                raise self._unavailable(f"the worker exited (code {self.proc.returncode}) "
                                        f"while {doing}")
            self._buf += chunk
        line, _, self._buf = self._buf.partition(b"\n")
        return json.loads(line)

    def _call(self, msg: dict, timeout_s: float | None = None) -> dict:
        if self._closed:
            raise EngineUnavailable("vllm engine: closed")
        if self.proc.poll() is not None:
            raise self._unavailable(f"the worker is not running (exit code {self.proc.returncode})")
        os.write(self._out, (json.dumps(msg) + "\n").encode())
        reply = self._read(time.monotonic() + (timeout_s or self.options.request_timeout_s),
                           f"answering {msg['op']!r}")
        if not reply.get("ok"):
            raise RuntimeError(f"vllm engine: {msg['op']} failed in the worker: {reply['error']} "
                               f"(log: {self.log_path})")
        return reply

    def _unavailable(self, what: str) -> EngineUnavailable:
        tail = log_tail(self.log_path, lines=25)
        fix = (f"run `{SETUP}`" if "No module named 'vllm'" in tail else
               "the log names the cause; the model folder must hold a causal LM that vLLM "
               "supports, and a CPU needs free memory for kv_cache_gb")
        return EngineUnavailable(f"vllm engine ({self.python} {WORKER.name}, model "
                                 f"{self.model_dir}): {what}. Fix: {fix}. Last lines of "
                                 f"{self.log_path}:\n{tail}")

    # --- weights ------------------------------------------------------------------------

    def _write(self, state: dict[str, torch.Tensor]) -> str:
        """Write `state` as the folder's model.safetensors (atomically); return its hash."""
        from safetensors.torch import save_file

        from traingym.weights.hashing import state_hash  # heavy: numpy

        covered = {n for group in self.aliases.values() for n in group}
        unknown = sorted(n for n in state if n not in covered)
        if unknown:
            raise KeyError(f"update_weights: the engine's model has no tensors {unknown[:5]}")
        out, canonical = {}, {}
        for first, group in self.aliases.items():
            name = next((n for n in group if n in state), None)
            if name is None:
                raise KeyError(f"update_weights: the state lacks {first!r} (and its aliases "
                               f"{group[1:]}); update_weights takes the full state")
            t = state[name].detach().to("cpu", self.dtype).contiguous()
            canonical[first] = t
            for i, n in enumerate(group):
                out[n] = t if i == 0 else t.clone()  # safetensors stores no shared tensors
        if self._disk_layout is not None:  # e.g. a MoE's 3-D experts back to one per expert
            from transformers.core_model_loading import revert_weight_conversion

            out = {n: t.contiguous() for n, t in
                   revert_weight_conversion(self._disk_layout, out).items()}
        tmp = self.model_dir / "model.safetensors.tmp"
        save_file(out, str(tmp), metadata={"format": "pt"})
        for old in self.model_dir.glob("model*.safetensors*"):
            if old != tmp:
                old.unlink()
        os.replace(tmp, self.model_dir / "model.safetensors")
        self._loaded_hash = state_hash(canonical)
        return self._loaded_hash

    def update_weights(self, state: dict[str, torch.Tensor], version: int) -> None:
        with self._lock:
            self._write(state)
            self._call({"op": "reload", "path": str(self.model_dir)})
            self.version = version

    def state_hash(self) -> str:
        """The hash of the state the worker last loaded (written by this engine, then reloaded
        by vLLM), each tied tensor once under its first sorted name as `wire_state` sends it.
        Not read back from vLLM's memory: vLLM on a CPU repacks its weights."""
        return self._loaded_hash

    # --- generation ---------------------------------------------------------------------

    async def generate(self, requests: list[GenerationRequest]) -> list[list[Completion]]:
        """In a worker thread, so the caller's event loop keeps running meanwhile."""
        return await asyncio.to_thread(self.generate_sync, requests)

    def generate_sync(self, requests: list[GenerationRequest]) -> list[list[Completion]]:
        wire = []
        for i, r in enumerate(requests):
            p = r.params
            if r.n < 1 or not r.prompt_ids:
                raise ValueError(f"request {i}: n must be >= 1 and the prompt non-empty")
            if len(r.prompt_ids) + p.max_new_tokens > self.max_model_len:
                raise ValueError(f"request {i}: {len(r.prompt_ids)} prompt + {p.max_new_tokens} "
                                 f"new tokens > the engine's max_model_len {self.max_model_len};"
                                 " raise rollout.engine_options.max_model_len")
            cut = p.temperature > 0 and (p.top_k > 0 or p.top_p < 1)
            if cut and not self.pre_cut_logprobs:
                raise ValueError("vllm engine: this vLLM's sampler could not be hooked to return "
                                 "log-probs before the top-k/top-p cut; sample with top_k=0, "
                                 "top_p=1")
            wire.append({"prompt_ids": list(r.prompt_ids), "n": r.n, "seed": int(r.seed),
                         "temperature": p.temperature, "top_p": p.top_p, "top_k": p.top_k,
                         "max_tokens": p.max_new_tokens, "stop_token_ids": list(p.stop_token_ids)})
        with self._lock:
            version = self.version
            outputs = self._call({"op": "generate", "requests": wire})["outputs"]
        return [[Completion(tuple(r.prompt_ids), c["token_ids"], c["logprobs"],
                            c["finish_reason"], version) for c in comps]
                for r, comps in zip(requests, outputs)]

    async def score(self, prompts: list[list[int]], completions: list[list[int]],
                    temperature: float) -> list[list[float]]:
        """rollout/base.py's `score`, in a worker thread (module docstring: Scores)."""
        return await asyncio.to_thread(self.score_sync, prompts, completions, temperature)

    def score_sync(self, prompts, completions, temperature: float) -> list[list[float]]:
        if len(prompts) != len(completions):
            raise ValueError(f"score: {len(prompts)} prompts for {len(completions)} completions")
        for i, (p, c) in enumerate(zip(prompts, completions)):
            if not p:
                raise ValueError(f"score: row {i} has an empty prompt")
            if len(p) + len(c) + 1 > self.max_model_len:
                raise ValueError(f"score: row {i} has {len(p)} prompt + {len(c)} completion "
                                 f"tokens, + 1 > the engine's max_model_len "
                                 f"{self.max_model_len}; raise engine_options.max_model_len")
        if temperature > 0 and temperature != 1.0 and not self.scaled_scores:
            raise ValueError(f"vllm engine: this vLLM's logits could not be scaled, so it scores "
                             f"only at temperature 1, not {temperature:g}")
        rows = [i for i, c in enumerate(completions) if c]
        out: list[list[float]] = [[] for _ in prompts]
        if not rows:
            return out
        msg = {"op": "score", "prompts": [list(prompts[i]) for i in rows],
               "completions": [list(completions[i]) for i in rows], "temperature": temperature}
        with self._lock:
            got = self._call(msg)["logprobs"]
        for i, lps in zip(rows, got):
            out[i] = lps
        return out

    def health(self) -> dict:
        alive = self.proc is not None and self.proc.poll() is None and not self._closed
        out = {"ok": alive, "version": self.version, "log": str(self.log_path)}
        if not alive:
            return out | {"error": "the vLLM worker is not running"}
        if self._lock.acquire(timeout=0.1):  # busy generating: it was alive a moment ago
            try:
                out["pid"] = self._call({"op": "health"}, timeout_s=30)["pid"]
            except (EngineUnavailable, RuntimeError) as e:
                out |= {"ok": False, "error": str(e)}
            finally:
                self._lock.release()
        return out

    def close(self) -> None:
        """Ask the worker to exit, kill it if it does not within 10 s, remove the folder."""
        if self._closed:
            return
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.write(self._out, b'{"op": "shutdown"}\n')
                self.proc.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                pass
        self._closed = True
        for fd in (getattr(self, "_out", None), getattr(self, "_in", None)):
            if fd is not None:
                os.close(fd)
        self._finalizer()  # kills what is left, removes the folder


def _aliases(state: dict[str, torch.Tensor]) -> dict[str, list[str]]:
    """Names grouped by the storage they share (tied weights), keyed by the first sorted."""
    return {g[0]: g for g in alias_groups(state)}


def _disk_layout(model):
    """A weightless (meta) copy of `model` that carries its checkpoint conversions, or None
    where its checkpoint names are its state's names. transformers >= 5 holds some weights
    in another layout in memory than on disk (Qwen3-MoE's and Mixtral's experts fused into
    3-D `experts.gate_up_proj`/`down_proj`); vLLM reads the disk layout (vLLM 0.32's Mixtral
    refuses the fused names, and its in-place reload of fused Qwen3-MoE experts on a CPU
    serves different outputs), so the engine writes that."""
    from transformers.conversion_mapping import get_model_conversion_mapping
    from transformers.core_model_loading import PrefixChange

    done = getattr(model, "_weight_conversions", None)  # set by from_pretrained
    if done is None:
        done = [c for c in get_model_conversion_mapping(model, add_legacy=False)
                if not isinstance(c, PrefixChange)]
    if not done:
        return None
    with torch.device("meta"):
        skeleton = type(model)(copy.deepcopy(model.config))
    skeleton._weight_conversions = done
    return skeleton


def _stop(proc: subprocess.Popen | None, work_dir: Path | None) -> None:
    stop_group(proc, 5.0, 5.0)  # its own session: the worker and anything it started
    if work_dir is not None:
        shutil.rmtree(work_dir, ignore_errors=True)
