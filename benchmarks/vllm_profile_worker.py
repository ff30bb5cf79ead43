"""engine_profile.py --engine vllm's worker, run by .venv-vllm's python (it imports vLLM and
torch only, no traingym): one warm-up call, one timed call, one call under torch.profiler, of
vLLM's offline LLM.generate on the prompts in --job; writes the timings and top ops to --out.

vLLM runs in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0, as traingym's vLLM worker runs it:
rollout/vllm_worker.py), so the profiler sees its model's ops; the engine's settings are those
of rollout/vllm_engine.py's worker: the same max_model_len, KV cache bytes and seed, eager off.
"""

from __future__ import annotations

import argparse
import json
import os
import time


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--job", required=True, help="JSON: model, dtype, prompts, temperature, ...")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    job = json.loads(open(args.job).read())
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    import torch
    import vllm

    llm = vllm.LLM(model=job["model"], dtype=job["dtype"], max_model_len=job["max_model_len"],
                   kv_cache_memory_bytes=job["kv_cache_bytes"], seed=0,
                   generation_config="vllm", skip_tokenizer_init=True, max_logprobs=1)
    params = [vllm.SamplingParams(temperature=job["temperature"], max_tokens=job["new_tokens"],
                                  ignore_eos=True, logprobs=1, seed=i, detokenize=False)
              for i in range(len(job["prompts"]))]
    prompts = [{"prompt_token_ids": p} for p in job["prompts"]]

    def call() -> float:
        t0 = time.perf_counter()
        outs = llm.generate(prompts, params, use_tqdm=False)
        seconds = time.perf_counter() - t0
        assert all(len(o.outputs[0].token_ids) == job["new_tokens"] for o in outs)
        return seconds

    call()  # warm-up
    one_call_s = call()
    with torch.profiler.profile() as prof:
        call()
    ops = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)[:25]
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25), flush=True)
    with open(args.out, "w") as f:
        json.dump({"vllm": vllm.__version__, "torch": torch.__version__,
                   "one_call_s": one_call_s,
                   "top_ops_self_cpu": [{"name": e.key, "self_cpu_s": e.self_cpu_time_total / 1e6,
                                         "calls": e.count} for e in ops]}, f)
    os._exit(0)  # skip vLLM's atexit teardown


if __name__ == "__main__":
    main()
