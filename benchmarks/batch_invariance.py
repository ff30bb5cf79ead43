"""Does batching change greedy answers on the built-in engine? The same 16 greedy chat
requests (embedded model, 24 new tokens) decoded together in one `generate_sync` call and one
at a time, with the engine in fp32 and in bf16; counts the answers whose token ids differ.
This is the engine's plain batched decoding, not serve's continuous batching: it separates a
property of the dtype from one of the batcher (BENCHMARKS.md "Serving").

    PYTHONPATH=src .venv/bin/python benchmarks/batch_invariance.py
        # -> benchmarks/results/batch_invariance/<date>-<commit>.json
    PYTHONPATH=src .venv/bin/python benchmarks/batch_invariance.py --requests 2 --tokens 4 \\
        --out /tmp/batch_invariance.json                               # smoke
"""

from __future__ import annotations

import argparse
import time

import resultfile
import torch

from traingym.models.families import stop_token_ids
from traingym.models.loader import load_policy
from traingym.core.precision import fast_bf16
from traingym.rollout.torch_engine import TorchEngine
from traingym.core.types import GenerationRequest, SamplingParams


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--requests", type=int, default=16)
    p.add_argument("--tokens", type=int, default=24)
    resultfile.add_args(p)
    a = p.parse_args()
    rec = resultfile.start("batch_invariance", a)
    torch.set_num_threads(2)
    model, tok = load_policy("embedded", seed=0)
    stops = tuple(stop_token_ids(tok))
    questions = [f"What is {3 + i} plus {40 + i}? Tell a short story about it."
                 for i in range(a.requests)]
    prompts = [tuple(tok(tok.apply_chat_template([{"role": "user", "content": q}],
                                                 add_generation_prompt=True, tokenize=False),
                         add_special_tokens=False).input_ids) for q in questions]
    params = SamplingParams(temperature=0.0, max_new_tokens=a.tokens, stop_token_ids=stops)
    reqs = [GenerationRequest(ids, 1, params) for ids in prompts]
    out = {"model": "embedded", "requests": a.requests, "new_tokens": a.tokens,
           "fast_bf16": fast_bf16(),  # precision.py: bf16 kernels on this CPU (auto picks bf16)
           "dtypes": {}}
    for dt in (torch.float32, torch.bfloat16):
        eng = TorchEngine(model, tok.pad_token_id, dtype=dt)
        together = [c[0].token_ids for c in eng.generate_sync(reqs)]
        alone = [eng.generate_sync([r])[0][0].token_ids for r in reqs]
        differ = [i for i, (x, y) in enumerate(zip(together, alone)) if x != y]
        first = [next(j for j, (u, v) in enumerate(zip(together[i], alone[i])) if u != v)
                 if together[i][:len(alone[i])] != alone[i][:len(together[i])] else
                 min(len(together[i]), len(alone[i])) for i in differ]
        name = str(dt).removeprefix("torch.")
        out["dtypes"][name] = {"differing": len(differ), "of": len(reqs),
                               "first_differing_token": first}
        print(f"{name}: {len(differ)} of {len(reqs)} greedy answers differ batched vs alone",
              flush=True)
    out["when"] = time.strftime("%Y-%m-%d %H:%M:%S")
    rec.write(out)


if __name__ == "__main__":
    main()
