"""One AdamW step over the embedded model's parameters: torch's fused kernel (what
trainer/optimizers.py make_optimizer picks for plain tensors) against the foreach one it
used before, side by side.

The parameters have the shapes of SmolLM2-135M-Instruct (134.5M, built from its config, random
values, fp32) with random gradients; both optimizers take one untimed step, then `--rounds`
rounds time `--steps` steps of each in turn (interleaved), and the medians per step are
reported with their ratio. Also recorded: whether the two give the same parameters after the
same steps (max abs difference; they round differently, so not bitwise).
`--isa avx2` restricts torch to AVX2 (set before torch is imported), as default_run.py does.

    .venv/bin/python benchmarks/optimizer_step.py            # -> benchmarks/results/optimizer_step/
    .venv/bin/python benchmarks/optimizer_step.py --rounds 1 --steps 1 --out /tmp/opt.json
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import resultfile

AVX2 = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2",
        "MKL_ENABLE_INSTRUCTIONS": "AVX2"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--isa", choices=("native", "avx2"), default="native")
    resultfile.add_args(ap)
    args = ap.parse_args()
    if args.isa == "avx2":
        os.environ.update(AVX2)
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from traingym.models.embedded import embedded_model_dir

    rec = resultfile.start("optimizer_step", args)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(embedded_model_dir()))
    base = [p.detach().float().clone() for p in model.parameters()]
    grads = [torch.randn_like(p) * 1e-3 for p in base]
    del model
    kinds = {"fused": {"fused": True}, "foreach": {"foreach": True}}
    params, opts = {}, {}
    for name, kw in kinds.items():
        params[name] = [torch.nn.Parameter(p.clone()) for p in base]
        for p, g in zip(params[name], grads):
            p.grad = g
        opts[name] = torch.optim.AdamW(params[name], lr=1e-5, weight_decay=0.01, **kw)
        opts[name].step()  # untimed: allocates the state
    times = {name: [] for name in kinds}
    for _ in range(args.rounds):
        for name, opt in opts.items():
            t0 = time.perf_counter()
            for _ in range(args.steps):
                opt.step()
            times[name].append((time.perf_counter() - t0) / args.steps)
    diff = max((a - b).abs().max().item() for a, b in zip(params["fused"], params["foreach"]))
    med = {name: statistics.median(ts) for name, ts in times.items()}
    figures = {
        "parameters": sum(p.numel() for p in base), "threads": args.threads, "isa": args.isa,
        "rounds": args.rounds, "steps_per_round": args.steps,
        "s_per_step": times, "median_s_per_step": med,
        "foreach_over_fused": med["foreach"] / med["fused"],
        "max_abs_param_difference": diff,
    }
    rec.write(figures)
    print(f"{figures['parameters'] / 1e6:.1f}M params, {args.threads} threads, {args.isa}: "
          f"fused {med['fused']:.3f} s, foreach {med['foreach']:.3f} s per step "
          f"({figures['foreach_over_fused']:.1f}x); max |diff| {diff:.2e}")


if __name__ == "__main__":
    main()
