"""Built-in engine vs Hugging Face `generate` on the embedded model, side by side in one run.

Same 16 chat prompts, batch 16, exactly 64 new tokens per row (end-of-turn ignored on both
sides), greedy and sampled at T=1. HF `generate` is timed in every setting of dtype (fp32,
bf16) x attention (sdpa, eager) x cache (dynamic, static), 8 in all, in the same run; the ratio
is taken against the fastest of all 8 (`best_hf`, with `hf_settings` listing what it was
chosen from). Each setting gets one warm-up call; then `--repeats` rounds time every setting
once in turn (interleaved, so machine noise falls on all settings alike), and each setting's
median is reported.

Not compared: throughput at other batch sizes, prompts of other lengths, or against vLLM.
    python benchmarks/engine_throughput.py --repeats 5   # benchmarks/results/engine_throughput.json
    python benchmarks/engine_throughput.py --repeats 1 --new-tokens 8 \
        --out /tmp/engine_throughput_smoke.json                    # smoke
"""

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.utils import logging as hf_logging

from traingym.envs.render import PromptRenderer
from traingym.envs.tasks import builtin_task
from traingym.models.embedded import embedded_model_dir
from traingym.rollout.torch_engine import TorchEngine
from traingym.types import GenerationRequest, SamplingParams

BATCH = 16
HF_SETTINGS = [(dtype, attn, cache) for dtype in (torch.float32, torch.bfloat16)
               for attn in ("sdpa", "eager") for cache in ("dynamic", "static")]


def interleaved(settings: dict, repeats: int) -> dict[str, float]:
    """Median seconds per call of each setting. One warm-up each, then `repeats` rounds that
    run every setting once in turn, so a noisy stretch of the shared machine hits all of them
    alike rather than one setting's whole series."""
    for fn in settings.values():
        fn()
    times = {name: [] for name in settings}
    for _ in range(repeats):
        for name, fn in settings.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(ts) for name, ts in times.items()}


def hf_setting(folder, prompts, tok, dtype, attn, cache, sample, new):
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, attn_implementation=attn).eval()
    enc = tok.pad({"input_ids": [list(p) for p in prompts]}, padding_side="left", return_tensors="pt")
    kwargs = dict(max_new_tokens=new, min_new_tokens=new, pad_token_id=tok.pad_token_id,
                  do_sample=sample, top_k=0, top_p=1.0, temperature=1.0 if sample else None)
    if cache == "static":
        kwargs["cache_implementation"] = "static"

    def run():
        with torch.no_grad():
            out = model.generate(**enc, **kwargs)
        assert out.shape[1] - enc["input_ids"].shape[1] == new

    return run


def engine_setting(folder, prompts, dtype, sample, new, fused=True):
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype).eval()
    engine = TorchEngine(model, pad_token_id=0, fused=fused)
    params = SamplingParams(temperature=1.0 if sample else 0.0, max_new_tokens=new)
    reqs = [GenerationRequest(p, 1, params, seed=i) for i, p in enumerate(prompts)]

    def run():
        out = engine.generate_sync(reqs)
        assert all(len(c[0].token_ids) == new for c in out)

    return run


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--new-tokens", type=int, default=64, help="per row (64 for the figures; "
                    "fewer only for a smoke run)")
    ap.add_argument("--out", default="benchmarks/results/engine_throughput.json")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    folder = embedded_model_dir()
    tok = AutoTokenizer.from_pretrained(folder)
    renderer = PromptRenderer(tok, prefill="")
    prompts = [renderer.ids(r) for r in builtin_task("arith").heldout[:BATCH]]
    new = args.new_tokens
    tokens = BATCH * new
    results = {}
    for sample in (False, True):
        mode = "sampled" if sample else "greedy"
        settings, hf_names = {}, []
        for dtype, attn, cache in HF_SETTINGS:
            name = f"hf_generate {str(dtype).split('.')[1]} {attn} {cache}"
            settings[name] = hf_setting(folder, prompts, tok, dtype, attn, cache, sample, new)
            hf_names.append(name)
        for dtype in (torch.float32, torch.bfloat16):
            d = str(dtype).split(".")[1]
            settings[f"traingym {d}"] = engine_setting(folder, prompts, dtype, sample, new)
            if dtype == torch.bfloat16:
                settings[f"traingym {d} (hf forward)"] = engine_setting(
                    folder, prompts, dtype, sample, new, fused=False)
        rows = {name: tokens / s for name, s in interleaved(settings, args.repeats).items()}
        del settings
        best_hf = max((rows[k], k) for k in hf_names)  # the fastest of all HF settings
        best_tg = max((v, k) for k, v in rows.items() if k.startswith("traingym") and "hf forward" not in k)
        results[mode] = {"tokens_per_s": rows, "hf_settings": hf_names, "best_hf": best_hf[1],
                         "best_hf_is": f"the fastest of all {len(hf_names)} HF settings, this run",
                         "best_traingym": best_tg[1], "ratio": best_tg[0] / best_hf[0]}
        print(f"\n{mode}: batch {BATCH}, {new} new tokens, {args.threads} threads")
        for k, v in sorted(rows.items(), key=lambda kv: -kv[1]):
            print(f"  {k:40s} {v:7.1f} tok/s")
        print(f"  ratio {best_tg[1]} / {best_hf[1]} (fastest of all {len(hf_names)} HF "
              f"settings): {best_tg[0] / best_hf[0]:.2f}x")
    results["machine"] = {"cpu": platform.processor() or platform.machine(),
                          "threads": args.threads, "torch": torch.__version__,
                          "loadavg_at_end": os.getloadavg()}
    results["args"] = {"repeats": args.repeats, "batch": BATCH, "new_tokens": new}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
