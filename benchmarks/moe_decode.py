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

`--profile` adds one profiled call of each path and its top ops by self CPU time; the AMX
kernels' calls (rollout/amx.py: C code, no aten op of their own) are recorded as ranges named
`amx.<function>` for that call.

What bounds both paths: the expert weights a decode step must read. During one more call of
the HF path, a hook on each layer's router records the distinct experts its decode steps pick
(rows x top-k picks among the experts); their weights, plus every dense weight, are the bytes
one step reads at least, whatever the kernels. Times each path's steps per second, that is the
weight-read rate each path reaches, set beside this machine's read bandwidth (the sum of a
512 MiB fp32 tensor, median of 5, --threads threads): a path cannot decode faster than the
read bandwidth over the bytes per step, so the two paths' ceiling is that rate over the HF
path's. The copy bandwidth (a 512 MiB tensor copied into another, read plus write) is
recorded beside it.
Not covered: trained checkpoints, Mixtral (the same fused code; its own test checks logits),
vLLM, a GPU.
"""

from __future__ import annotations

import argparse
import contextlib
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
    reads = weight_reads(engines["hf"], reqs, args.rows)
    copy_gbs, read_gbs = copy_bandwidth_gbs(), read_bandwidth_gbs()
    steps_per_s = {name: t / args.rows for name, t in med.items()}
    reads["read_gbs"] = {name: reads["bytes_per_step"] * sp / 1e9
                         for name, sp in steps_per_s.items()}
    reads["copy_bandwidth_gbs"] = copy_gbs
    reads["read_bandwidth_gbs"] = read_gbs
    reads["ceiling_over_hf"] = read_gbs / reads["read_gbs"]["hf"]
    top = {}
    for name, engine in engines.items() if args.profile else ():
        with torch.profiler.profile() as prof, kernels_named():
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
           "same_tokens_frac": same, "weight_reads": reads, "top_ops": top}
    print(f"{params / 1e6:.0f}M params, {args.dtype}, {args.rows} rows: fused "
          f"{med['fused']:.1f} tok/s, HF {med['hf']:.1f} tok/s, {res['fused_over_hf']:.2f}x; "
          f"same tokens {same:.0%}")
    print(f"experts read per layer per step {reads['experts_per_layer_step']:.1f} of "
          f"{args.experts}; {reads['bytes_per_step'] / 1e6:.0f} MB per step; fused "
          f"{reads['read_gbs']['fused']:.1f} GB/s, HF {reads['read_gbs']['hf']:.1f} GB/s, "
          f"read {read_gbs:.1f} GB/s (copy {copy_gbs:.1f}): ceiling "
          f"{reads['ceiling_over_hf']:.2f}x the HF path")
    rec.write(res)


@contextlib.contextmanager
def kernels_named():
    """Each call of rollout/amx.py's kernels inside a profiler range `amx.<function>`."""
    import torch

    from traingym.rollout import amx

    names = ("linear", "moe", "decode_attention")
    saved = {n: getattr(amx, n) for n in names}

    def named(n, fn):
        def call(*args, **kwargs):
            with torch.profiler.record_function(f"amx.{n}"):
                return fn(*args, **kwargs)
        return call

    for n in names:
        setattr(amx, n, named(n, saved[n]))
    try:
        yield
    finally:
        for n in names:
            setattr(amx, n, saved[n])


def weight_reads(engine, reqs, rows: int) -> dict:
    """Bytes of weights one decode step reads at least: every dense weight, plus the experts
    the routers pick, counted over one generate call of `engine` (the HF path) by a hook on
    each layer's router (Qwen3MoeTopKRouter: (logits, scores, indices))."""
    model = engine.model
    blocks = [m for m in model.modules() if hasattr(m, "gate") and hasattr(m, "experts")]
    picked: list[int] = []

    def hook(module, args, out):
        if out[2].shape[0] == rows:  # a decode step: one token per row (not the prefill)
            picked.append(out[2].unique().numel())

    handles = [b.gate.register_forward_hook(hook) for b in blocks]
    try:
        engine.generate_sync(reqs)
    finally:
        for h in handles:
            h.remove()
    experts = blocks[0].experts
    expert_bytes = sum(p.numel() * p.element_size() for p in experts.parameters())
    n_experts = model.config.num_experts
    all_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    embed = model.get_input_embeddings().weight
    dense = (all_bytes - len(blocks) * expert_bytes
             - embed.numel() * embed.element_size())  # the lookup reads rows, not the table
    per_layer = statistics.fmean(picked)
    return {"experts_per_layer_step": per_layer, "expert_mb": expert_bytes / n_experts / 1e6,
            "bytes_per_step": dense + len(blocks) * per_layer * expert_bytes / n_experts}


def _median_s(fn, repeats: int) -> float:
    """Median seconds of `repeats` calls of `fn`, after one untimed call."""
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def read_bandwidth_gbs(mib: int = 512, repeats: int = 5) -> float:
    """Memory read bandwidth as torch sees it: a sum over a tensor far larger than caches."""
    import torch

    x = torch.ones(mib * 2**20 // 4)
    return x.numel() * x.element_size() / _median_s(x.sum, repeats) / 1e9


def copy_bandwidth_gbs(mib: int = 512, repeats: int = 5) -> float:
    """Memory bandwidth of this machine as torch's copy sees it: bytes read plus written."""
    import torch

    src = torch.ones(mib * 2**20 // 2, dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    return 2 * src.numel() * src.element_size() / _median_s(lambda: dst.copy_(src), repeats) / 1e9


if __name__ == "__main__":
    main()
