"""AdamW with 8-bit moments on a CPU: bitsandbytes' AdamW8bit (what trainer/optimizers.py builds
for `trainer.optimizer = "adamw_8bit"`) and torchao's AdamW8bit (where installed), beside
torch's fused fp32 AdamW (the default).

The parameters have the shapes of SmolLM2-135M-Instruct (134.5M, random values, fp32) with
random gradients. Each optimizer's first step is timed alone (it allocates the state; torchao
also compiles), then `--rounds` rounds time `--steps` steps of each in turn (interleaved) and
the medians per step are reported, with the optimizer state's bytes per parameter.

    .venv/bin/python benchmarks/optimizer_8bit.py     # -> benchmarks/results/optimizer_8bit/
    .venv/bin/python benchmarks/optimizer_8bit.py --rounds 1 --steps 1 --out /tmp/o8.json
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import time

import resultfile


def state_bytes(opt) -> int:
    """Bytes of the optimizer state (a quantization map shared by all tensors counted once)."""
    import torch

    seen, total = set(), 0
    for st in opt.state.values():
        for v in st.values():
            if not torch.is_tensor(v):
                continue
            parts = [getattr(v, a) for a in ("codes", "scale")] if hasattr(v, "codes") else [v]
            for t in parts:
                if t.data_ptr() not in seen:
                    seen.add(t.data_ptr())
                    total += t.numel() * t.element_size()
    return total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    resultfile.add_args(ap)
    args = ap.parse_args()
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from traingym.models.embedded import embedded_model_dir
    from traingym.trainer.optimizers import adamw_8bit_class

    rec = resultfile.start("optimizer_8bit", args)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(embedded_model_dir()))
    base = [p.detach().float().clone() for p in model.parameters()]
    grads = [torch.randn_like(p) * 1e-3 for p in base]
    del model
    kinds = {"torch_fused": lambda ps: torch.optim.AdamW(ps, lr=1e-5, fused=True),
             "bitsandbytes": lambda ps: adamw_8bit_class()(ps, lr=1e-5, weight_decay=0.0)}
    if importlib.util.find_spec("torchao") is not None:
        from torchao.optim import AdamW8bit

        kinds["torchao"] = lambda ps: AdamW8bit(ps, lr=1e-5, weight_decay=0.0)
    opts, first = {}, {}
    for name, make in kinds.items():
        params = [torch.nn.Parameter(p.clone()) for p in base]
        for p, g in zip(params, grads):
            p.grad = g
        opts[name] = make(params)
        t0 = time.perf_counter()
        opts[name].step()
        first[name] = time.perf_counter() - t0
    times = {name: [] for name in kinds}
    for _ in range(args.rounds):
        for name, opt in opts.items():
            t0 = time.perf_counter()
            for _ in range(args.steps):
                opt.step()
            times[name].append((time.perf_counter() - t0) / args.steps)
    n = sum(p.numel() for p in base)
    med = {name: statistics.median(ts) for name, ts in times.items()}
    figures = {
        "parameters": n, "threads": args.threads, "rounds": args.rounds,
        "steps_per_round": args.steps, "first_step_s": first, "s_per_step": times,
        "median_s_per_step": med,
        "state_bytes_per_parameter": {k: state_bytes(o) / n for k, o in opts.items()},
    }
    rec.write(figures)
    for name in kinds:
        print(f"{name}: first step {first[name]:.2f} s, then {med[name]:.3f} s per step, "
              f"state {figures['state_bytes_per_parameter'][name]:.2f} B/param")


if __name__ == "__main__":
    main()
