"""Decode speed of a mixture-of-experts model in the built-in engine: the fused MoE path
(rollout/fused_moe.py: top-k routing, one matmul per expert over the tokens routed to it)
against the plain Hugging Face forward, side by side.

The model is a random-init Qwen3-MoE built here (benchmarks/moe_mismatch.py's builder: --hidden,
--layers, --experts, --top-k; the tiny tokenizer); prompts are the arith task's held-out rows.
Each round runs one engine call per path (--rows prompts, --new-tokens greedy tokens, no stop),
alternating which goes first, after one untimed warm-up call of each; the medians of
tokens/s and their ratio are reported, and whether the two paths generated the same tokens
(the fused path computes the same model in another order, so a rare near-tie may differ).

    PYTHONPATH=src .venv/bin/python benchmarks/moe_decode.py --label 230m
        # -> benchmarks/results/moe_decode/<date>-<commit>[-label].json
    PYTHONPATH=src .venv/bin/python benchmarks/moe_decode.py --hidden 64 --layers 2 \\
        --experts 8 --rounds 1 --new-tokens 4 --out /tmp/moe_decode.json   # smoke

`--profile` adds one profiled call of each path and its top ops by self CPU time.
Not covered: trained checkpoints, Mixtral (the same fused code; its own test checks logits),
vLLM, a GPU.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import resultfile
from moe_mismatch import build_model


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hidden", type=int, default=768)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--experts", type=int, default=32)
    ap.add_argument("--top-k", type=int, default=4)
    ap.add_argument("--rows", type=int, default=16)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--profile", action="store_true",
                    help="also one profiled call of each path: its top ops (torch.profiler)")
    resultfile.add_args(ap)
    args = ap.parse_args()
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from traingym.core.types import GenerationRequest, SamplingParams
    from traingym.envs.render import PromptRenderer
    from traingym.envs.tasks import builtin_task
    from traingym.rollout.torch_engine import TorchEngine

    rec = resultfile.start("moe_decode", args)
    torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    with tempfile.TemporaryDirectory() as tmp:
        folder = build_model(Path(tmp) / "moe", args)
        tok = AutoTokenizer.from_pretrained(folder)
        engines = {name: TorchEngine(AutoModelForCausalLM.from_pretrained(folder, dtype=dtype),
                                     tok.pad_token_id, fused=fused)
                   for name, fused in (("fused", True), ("hf", False))}
        params = sum(p.numel() for p in engines["hf"].model.parameters())
    prompts = [PromptRenderer(tok).ids(r) for r in builtin_task("arith").heldout[: args.rows]]
    reqs = [GenerationRequest(p, 1, SamplingParams(0, max_new_tokens=args.new_tokens), i)
            for i, p in enumerate(prompts)]
    out = {name: e.generate_sync(reqs) for name, e in engines.items()}  # warm-up
    same = sum(a[0].token_ids == b[0].token_ids
               for a, b in zip(out["fused"], out["hf"])) / len(reqs)
    tps = {name: [] for name in engines}
    for r in range(args.rounds):
        for name in (("fused", "hf") if r % 2 == 0 else ("hf", "fused")):
            t0 = time.perf_counter()
            done = engines[name].generate_sync(reqs)
            seconds = time.perf_counter() - t0
            tps[name].append(sum(len(c[0].token_ids) for c in done) / seconds)
    med = {name: statistics.median(v) for name, v in tps.items()}
    top = {}
    for name, engine in engines.items() if args.profile else ():
        with torch.profiler.profile() as prof:
            engine.generate_sync(reqs)
        ops = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)[:8]
        total = sum(e.self_cpu_time_total for e in prof.key_averages())
        top[name] = [{"op": e.key, "self_cpu_share": e.self_cpu_time_total / total,
                      "calls": e.count, "avg_us": e.self_cpu_time_total / e.count}
                     for e in ops]
    res = {"model": {"random_init": "Qwen3-MoE", "hidden": args.hidden, "layers": args.layers,
                     "experts": args.experts, "top_k": args.top_k, "params": params},
           "dtype": args.dtype, "rows": args.rows, "new_tokens": args.new_tokens,
           "threads": args.threads, "rounds": args.rounds, "tokens_per_s": tps,
           "median_tokens_per_s": med, "fused_over_hf": med["fused"] / med["hf"],
           "same_tokens_frac": same, "top_ops": top}
    print(f"{params / 1e6:.0f}M params, {args.dtype}: fused {med['fused']:.1f} tok/s, "
          f"HF {med['hf']:.1f} tok/s, {res['fused_over_hf']:.2f}x; same tokens {same:.0%}")
    rec.write(res)


if __name__ == "__main__":
    main()
