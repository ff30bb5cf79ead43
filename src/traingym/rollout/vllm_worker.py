"""The vLLM side of traingym's vLLM engine: a standalone program, run by the vLLM venv's python.

    <.venv-vllm/bin/python> vllm_worker.py --model DIR --fd-in R --fd-out W [--dtype ...]

It imports only the stdlib, vllm, torch and safetensors (traingym is not installed in that venv;
rollout/vllm_engine.py starts it). It owns one in-process `vllm.LLM` (one process to watch and
kill) and answers JSON lines on `--fd-in` with one line each on `--fd-out` (protocol: `serve`);
vLLM's logging goes to stdout/stderr, off the channel. Worker extensions (`PreCutLogprobs`) make
vLLM's log-probs and scores meet traingym's contract. It exits when its parent dies (removing
`--owned-dir`) or its command pipe closes.
Not covered: stop strings, LoRA, tensor parallelism (one LLM per worker), streaming.
"""

from __future__ import annotations

import os
import sys

# Run as a script, this file's folder (traingym/rollout) would come first on sys.path and its
# modules would shadow the stdlib's and vLLM's (rollout/http.py would hide `http`): put it last,
# where only `vllm_worker` itself (vLLM's worker_extension_cls) is looked up from it.
_HERE = os.path.dirname(os.path.abspath(__file__))
if sys.path and os.path.abspath(sys.path[0] or ".") == _HERE:
    sys.path.append(sys.path.pop(0))

import argparse  # noqa: E402
import faulthandler  # noqa: E402
import json  # noqa: E402
import signal  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402


class PreCutLogprobs:
    """vLLM worker extension (`worker_extension_cls`): methods here run inside vLLM's worker
    through `LLM.collective_rpc`. Each returns False where it cannot install (another model
    runner); the engine then refuses what needs it."""

    def traingym_pre_cut_logprobs(self) -> bool:
        """Make the sampler report log_softmax(logits / T) before top-k/top-p: with
        `processed_logprobs` vLLM reports them after the cut, and the contract is before it."""
        import torch

        runner = getattr(self, "model_runner", None)
        sampler = getattr(runner, "sampler", None)
        tks = getattr(sampler, "topk_topp_sampler", None)
        if tks is None or getattr(sampler, "logprobs_mode", None) != "processed_logprobs":
            return False
        if getattr(tks, "_traingym_pre_cut", False):
            return True
        inner = tks.forward  # the platform's implementation, chosen in its __init__

        def forward(logits, generators, k, p):
            pre = None if k is None and p is None else logits.log_softmax(-1, dtype=torch.float32)
            sampled, processed = inner(logits, generators, k, p)  # may cut `logits` in place
            return sampled, processed if pre is None else pre

        tks.forward = forward
        tks._traingym_pre_cut = True
        return True

    def traingym_logit_scale(self, scale: float) -> bool:
        """Divide the logits the model computes by `scale` (1.0: unchanged) from now on. vLLM's
        prompt log-probs are of the raw logits whatever the temperature: `score` sets T per call."""
        model = getattr(getattr(self, "model_runner", None), "model", None)
        if model is None or not callable(getattr(model, "compute_logits", None)):
            return False
        if not getattr(model, "_traingym_scaled", False):
            inner = model.compute_logits

            def compute_logits(*args, **kwargs):
                logits = inner(*args, **kwargs)
                s = model._traingym_scale
                return logits if logits is None or s == 1.0 else logits.float() / s

            model.compute_logits = compute_logits
            model._traingym_scaled = True
        model._traingym_scale = float(scale)
        return True

    def traingym_repack_moe(self) -> int:
        """Redo the CPU MoE kernel's prepacking of the expert weights after `reload_weights`;
        returns how many expert layers were repacked. vLLM 0.32 on a weight update only copies
        the experts' new weights (fused_moe/unquantized_fused_moe_method.py `_setup_kernel`,
        `is_weight_update`) and skips `fused_experts.process_weights_after_loading`, where the
        CPU experts (fused_moe/experts/cpu_moe.py) prepack them (`cpu_prepack_moe_weight`):
        the kernel then reads the checkpoint's layout as prepacked and serves wrong outputs.
        An MoE kernel on a CPU other than that class raises (outputs would be wrong); on other
        platforms nothing is done (not measured here)."""
        model = getattr(getattr(self, "model_runner", None), "model", None)
        if model is None:
            return 0
        from vllm.platforms import current_platform

        if not current_platform.is_cpu():
            return 0
        try:
            from vllm.model_executor.layers.fused_moe.experts.cpu_moe import (
                CPUUnquantizedExperts)
        except ImportError:  # another vLLM: refused below if the model has MoE layers
            CPUUnquantizedExperts = None
        done = 0
        for layer in model.modules():
            kernel = getattr(getattr(layer, "quant_method", None), "moe_kernel", None)
            if kernel is None:
                continue
            experts = getattr(kernel, "fused_experts", None)
            if CPUUnquantizedExperts is None or not isinstance(experts, CPUUnquantizedExperts):
                raise RuntimeError(
                    f"traingym cannot repack the CPU MoE kernel {type(experts).__name__} after "
                    "a weight reload (it knows vLLM 0.32's CPUUnquantizedExperts), and vLLM "
                    "skips that step on updates, so the experts would serve wrong outputs; "
                    "use rollout.engine='torch' for this model")
            experts.process_weights_after_loading(layer)
            done += 1
        return done


def _watch_parent(parent: int, owned: str | None) -> None:
    while True:
        if os.getppid() != parent:  # the engine's process died: nobody can read our answers
            if owned:  # nor remove the engine's work folder
                import shutil

                shutil.rmtree(owned, ignore_errors=True)
            os._exit(3)
        time.sleep(0.5)


def _sampling(r: dict, vllm):
    greedy = r["temperature"] == 0
    return vllm.SamplingParams(
        n=1 if greedy else r["n"], temperature=r["temperature"],
        top_p=1.0 if greedy else r["top_p"], top_k=0 if greedy else r["top_k"],
        max_tokens=r["max_tokens"],
        stop_token_ids=list(r["stop_token_ids"]), ignore_eos=True, seed=r["seed"],
        logprobs=0, detokenize=False, skip_special_tokens=False)


def generate(llm, vllm, requests: list[dict]) -> list[list[dict]]:
    prompts = [{"prompt_token_ids": list(r["prompt_ids"])} for r in requests]
    params = [_sampling(r, vllm) for r in requests]
    results = llm.generate(prompts, params, use_tqdm=False)
    out = []
    for r, result in zip(requests, results):
        comps = []
        for c in sorted(result.outputs, key=lambda c: c.index):
            ids = list(c.token_ids)
            lps = [float(c.logprobs[i][t].logprob) for i, t in enumerate(ids)]
            comps.append({"token_ids": ids, "logprobs": lps,
                          "finish_reason": "stop" if c.finish_reason == "stop" else "length"})
        if r["temperature"] == 0:  # vLLM takes n=1 only for greedy; the n copies are equal
            comps = comps * r["n"]
        out.append(comps)
    return out


def score(llm, vllm, prompts: list[list[int]], completions: list[list[int]],
          temperature: float) -> list[list[float]]:
    """Log-prob of each completion token under softmax(logits / T) (T <= 0: T = 1)."""
    scale = temperature if temperature > 0 else 1.0
    params = vllm.SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0,
                                 ignore_eos=True, detokenize=False, skip_special_tokens=False)
    inputs = [{"prompt_token_ids": list(p) + list(c)} for p, c in zip(prompts, completions)]
    if scale != 1.0 and not all(llm.collective_rpc("traingym_logit_scale", args=(scale,))):
        raise RuntimeError("cannot scale this vLLM's logits: score only at temperature 1")
    try:
        results = llm.generate(inputs, params, use_tqdm=False)
    finally:
        if scale != 1.0:
            llm.collective_rpc("traingym_logit_scale", args=(1.0,))
    out = []
    for p, c, result in zip(prompts, completions, results):
        rows = result.prompt_logprobs  # row i: the log-prob of prompt token i (row 0: None)
        out.append([float(rows[len(p) + j][t].logprob) for j, t in enumerate(c)])
    return out


def serve(llm, vllm, fin, fout, served: str) -> None:
    """Answer one JSON line per request ({"op": ...}) until shutdown or EOF:
    - generate {"requests": [{prompt_ids, n, temperature, top_p, top_k, max_tokens,
      stop_token_ids, seed}]} -> {"outputs": [[{token_ids, logprobs, finish_reason}] * n]}
    - score {"prompts", "completions", "temperature"} -> {"logprobs": [[float]]}
    - reload {"path": DIR} (weights in place); health -> {"pid", "served"}; shutdown.
    Every reply has "ok"; a failure is {"ok": false, "error": "<type>: <message>"} and serving
    goes on. `main` first sends {"ready", "pre_cut_logprobs", "scaled_scores", "vllm"}."""
    def reply(msg: dict) -> None:
        fout.write(json.dumps(msg) + "\n")
        fout.flush()

    for line in fin:
        msg = json.loads(line)
        op = msg.get("op")
        try:
            if op == "generate":
                reply({"ok": True, "outputs": generate(llm, vllm, msg["requests"])})
            elif op == "score":
                reply({"ok": True, "logprobs": score(llm, vllm, msg["prompts"],
                                                     msg["completions"], msg["temperature"])})
            elif op == "reload":
                t0 = time.perf_counter()
                llm.collective_rpc("reload_weights", kwargs={"weights_path": msg["path"]})
                repacked = sum(llm.collective_rpc("traingym_repack_moe"))
                served = msg["path"]
                reply({"ok": True, "seconds": time.perf_counter() - t0,
                       "moe_layers_repacked": repacked})
            elif op == "health":
                reply({"ok": True, "pid": os.getpid(), "served": served})
            elif op == "shutdown":
                reply({"ok": True})
                return
            else:
                reply({"ok": False, "error": f"ValueError: unknown op {op!r}"})
        except Exception as e:  # one failed request must not take the engine down
            traceback.print_exc()
            reply({"ok": False, "error": f"{type(e).__name__}: {e}"})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--fd-in", type=int, required=True)
    ap.add_argument("--fd-out", type=int, required=True)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--max-model-len", type=int, default=512)
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.3)
    ap.add_argument("--kv-cache-bytes", type=int, default=None,
                    help="KV cache size; set, it replaces --gpu-memory-utilization")
    ap.add_argument("--enforce-eager", action="store_true")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--owned-dir", default=None, help="removed if the parent dies first")
    args = ap.parse_args()
    faulthandler.register(signal.SIGUSR1)  # `kill -USR1 <pid>`: every thread's stack, to the log
    fin = os.fdopen(args.fd_in, "r", encoding="utf-8")
    fout = os.fdopen(args.fd_out, "w", encoding="utf-8")
    threading.Thread(target=_watch_parent, args=(os.getppid(), args.owned_dir),
                     daemon=True).start()
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    import vllm

    llm = vllm.LLM(model=args.model, dtype=args.dtype, max_model_len=args.max_model_len,
                   gpu_memory_utilization=args.gpu_memory_utilization,
                   kv_cache_memory_bytes=args.kv_cache_bytes,
                   enforce_eager=args.enforce_eager, seed=args.seed,
                   logprobs_mode="processed_logprobs", generation_config="vllm",
                   skip_tokenizer_init=True, max_logprobs=1,
                   worker_extension_cls="vllm_worker.PreCutLogprobs")
    pre_cut = all(llm.collective_rpc("traingym_pre_cut_logprobs"))
    scaled = all(llm.collective_rpc("traingym_logit_scale", args=(1.0,)))
    # One token now, so a model vLLM cannot run here (an attention head size its CPU kernels
    # lack) fails at start, not at the first rollout; it also pays vLLM's first-call warm-up.
    generate(llm, vllm, [{"prompt_ids": [0, 1], "n": 1, "temperature": 1.0, "top_p": 0.9,
                          "top_k": 5, "max_tokens": 2, "stop_token_ids": [], "seed": 0}])
    fout.write(json.dumps({"ok": True, "ready": True, "pre_cut_logprobs": pre_cut,
                           "scaled_scores": scaled, "vllm": vllm.__version__}) + "\n")
    fout.flush()
    serve(llm, vllm, fin, fout, args.model)
    fout.close()
    os._exit(0)  # skip vLLM's atexit teardown: the process owns nothing else


if __name__ == "__main__":
    main()
