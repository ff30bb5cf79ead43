"""Did generalising the fused decode to the model families slow the Llama path down?

Times the old Llama-only module (rollout/fused_llama.py read from git at --baseline, default
bf9721c, the last commit that had it) against rollout/fused_decoder.py on the same model and
the same inputs: one prefill, then --steps decode steps of --rows rows, in rounds that run
both back to back (old then new, then new then old, ...) so that load on this shared machine
hits both alike. Reports the median seconds per decode step of each, new/old of the medians,
of the fastest rounds (on a loaded machine the least disturbed round is closest to the
code's own cost) and the median of the per-round ratios; checks both give the same logits.

    .venv/bin/python benchmarks/fused_decode_families.py            # embedded SmolLM2-135M
        # -> benchmarks/results/fused_decode_families/<date>-<commit>.json
    .venv/bin/python benchmarks/fused_decode_families.py --model tiny   # ... <commit>-tiny.json

Writes a new result file with its provenance (benchmarks/resultfile.py); with --model tiny its
name ends in -tiny unless --label says otherwise.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import subprocess
import sys
import time
from pathlib import Path

import resultfile
import torch

ROOT = Path(__file__).resolve().parents[1]


def load_baseline(commit: str):
    src = subprocess.run(["git", "show", f"{commit}:src/traingym/rollout/fused_llama.py"],
                         cwd=ROOT, check=True, capture_output=True, text=True).stdout
    path = Path("/tmp") / f"fused_llama_{commit}.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location(f"fused_llama_{commit}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.FusedLlama


def run(fused, ids, mask, pos, steps: int) -> tuple[float, torch.Tensor]:
    """Seconds per decode step (prefill excluded) and the last logits."""
    logits, cache = fused.prefill(ids, mask, pos, ids.shape[1] + steps)
    next_pos = pos[:, -1] + 1
    t0 = time.perf_counter()
    for _ in range(steps):
        tok = logits.argmax(-1)
        mask = torch.cat([mask, torch.ones_like(tok)[:, None]], 1)
        logits = fused.decode(tok, next_pos, cache, mask.shape[1] - 1, mask)
        next_pos = next_pos + 1
    return (time.perf_counter() - t0) / steps, logits


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="embedded", help="'embedded', 'tiny' or a folder")
    p.add_argument("--baseline", default="bf9721c")
    p.add_argument("--rows", type=int, default=64)
    p.add_argument("--prompt-tokens", type=int, default=40)
    p.add_argument("--steps", type=int, default=16)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--threads", type=int, default=1)
    resultfile.add_args(p)
    args = p.parse_args()
    args.label = args.label or ("tiny" if args.model == "tiny" else None)
    rec = resultfile.start("fused_decode_families", args)
    torch.set_num_threads(args.threads)
    from traingym.models.loader import load_policy
    from traingym.rollout.fused_decoder import FusedDecoder

    model, tok = load_policy(args.model)
    model.eval()
    old_cls = load_baseline(args.baseline)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, model.config.vocab_size, (args.rows, args.prompt_tokens), generator=g)
    mask = torch.ones_like(ids)
    pos = torch.arange(args.prompt_tokens)[None].expand(args.rows, -1)
    impls = {"old": old_cls(model), "new": FusedDecoder(model)}
    times = {k: [] for k in impls}
    last = {}
    run(impls["old"], ids, mask, pos, 2)  # warm-up
    run(impls["new"], ids, mask, pos, 2)
    for i in range(args.rounds):  # A B, then B A: neither always runs first
        for name in (["old", "new"] if i % 2 == 0 else ["new", "old"]):
            s, last[name] = run(impls[name], ids, mask, pos, args.steps)
            times[name].append(s)
    paired = [n / o for n, o in zip(times["new"], times["old"])]
    med = {k: statistics.median(v) for k, v in times.items()}
    best = {k: min(v) for k, v in times.items()}  # the least disturbed round of each
    result = {
        "model": args.model, "params": sum(p.numel() for p in model.parameters()),
        "dtype": str(next(model.parameters()).dtype), "rows": args.rows,
        "prompt_tokens": args.prompt_tokens, "decode_steps": args.steps,
        "rounds": args.rounds, "threads": args.threads, "baseline_commit": args.baseline,
        "seconds_per_step": times, "median_s_per_step": med,
        "new_over_old": med["new"] / med["old"],
        "min_s_per_step": best, "new_over_old_min": best["new"] / best["old"],
        "new_over_old_per_round": paired,
        "new_over_old_paired_median": statistics.median(paired),
        "max_abs_logit_diff": (last["new"] - last["old"]).abs().max().item(),
        "python": sys.version.split()[0], "torch": torch.__version__,
    }
    path = rec.write(result)
    print(f"{args.model}: old {med['old'] * 1e3:.2f} ms/step, new {med['new'] * 1e3:.2f} "
          f"ms/step, new/old {result['new_over_old']:.3f} (fastest rounds: "
          f"{result['new_over_old_min']:.3f}, median per-round ratio: "
          f"{result['new_over_old_paired_median']:.3f}), max |logit diff| "
          f"{result['max_abs_logit_diff']:.1e} -> {path}")


if __name__ == "__main__":
    main()
