"""Time and profile one built-in engine call: 16 arith prompts x 64 greedy tokens, bf16.

    python benchmarks/engine_profile.py [--plain-hf-forward]

Prints the wall time of one warm call and the torch profiler's top ops (where decode time goes).
"""

import argparse
import time

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from traingym.envs.render import PromptRenderer
from traingym.envs.tasks import builtin_task
from traingym.models.embedded import embedded_model_dir
from traingym.rollout.torch_engine import TorchEngine
from traingym.types import GenerationRequest, SamplingParams


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--plain-hf-forward", action="store_true", help="engine without the fused path")
    args = ap.parse_args()
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
    print(f"one call, 16 x 64 greedy tokens: {time.perf_counter() - t0:.2f} s")
    with torch.profiler.profile() as prof:
        engine.generate_sync(reqs)
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25))


if __name__ == "__main__":
    main()
