"""Time and profile one built-in engine call: 16 arith prompts x 64 greedy tokens, bf16.

    python benchmarks/engine_profile.py [--plain-hf-forward] [--label L]
        # -> benchmarks/results/engine_profile/<date>-<commit>[-L].json
    python benchmarks/engine_profile.py --out /tmp/engine_profile.json    # a check, not a result

Prints the wall time of one warm call and the torch profiler's top ops (where decode time
goes), and writes both to a new result file with its provenance (benchmarks/resultfile.py). One
call: single figures move by 20-35% between runs on a shared machine (BENCHMARKS.md); compare
commits side by side, not against an old figure.
"""

import argparse
import time

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
    resultfile.add_args(ap)
    args = ap.parse_args()
    rec = resultfile.start("engine_profile", args)
    torch.set_num_threads(2)
    folder = embedded_model_dir()
    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16).eval()
    engine = TorchEngine(model, tok.pad_token_id, fused=not args.plain_hf_forward)
    prompts = [PromptRenderer(tok).ids(r) for r in builtin_task("arith").heldout[:16]]
    reqs = [GenerationRequest(p, 1, SamplingParams(0, max_new_tokens=64), i) for i, p in enumerate(prompts)]
    engine.generate_sync(reqs)  # warm-up
    t0 = time.perf_counter()
    engine.generate_sync(reqs)
    one_call_s = time.perf_counter() - t0
    print(f"one call, 16 x 64 greedy tokens: {one_call_s:.2f} s")
    with torch.profiler.profile() as prof:
        engine.generate_sync(reqs)
    ops = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)[:25]
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25))
    rec.write({
        "fused": not args.plain_hf_forward, "threads": 2, "torch": torch.__version__,
        "one_call_s": one_call_s,
        "top_ops_self_cpu": [{"name": e.key, "self_cpu_s": e.self_cpu_time_total / 1e6,
                              "calls": e.count} for e in ops]})


if __name__ == "__main__":
    main()
