"""Which attention kernel the trainer's passes should use on a CPU: torch's flash kernel against
its math kernel, forward plus backward, by sequence length (models/scoring.py
`short_rows_attention` picks math up to MATH_ATTENTION_TOKENS tokens).

    PYTHONPATH=src .venv/bin/python benchmarks/attention_kernels.py
        # -> benchmarks/results/attention_kernels/<date>-<commit>.json (benchmarks/resultfile.py)
    PYTHONPATH=src .venv/bin/python benchmarks/attention_kernels.py --rounds 1 \\
        --shapes 4x8x8 --out /tmp/attention_kernels.json        # smoke

Each shape is rows x query tokens x key tokens with the embedded model's attention (9 query
heads over 3 key/value heads, head size 64), bf16 inputs as under the trainer's autocast, the
causal mask when queries and keys are the same length (a full row), else the last queries of
the keys (a completion after a cached prompt, as the trainer's completion pass). One timed
call is F.scaled_dot_product_attention with enable_gqa under one kernel, then the backward of
the sum of its output. Rounds alternate the kernels after one untimed call of each; medians.
The first two shapes are the default task's trainer passes (16 prompts of 41 tokens; 64
completions of 8 tokens attending to 48 positions).
"""

from __future__ import annotations

import argparse
import statistics
import time

import resultfile

SHAPES = ("16x41x41", "64x7x48", "16x48x48", "16x96x96", "16x128x128", "16x192x192",
          "16x256x256", "8x512x512", "4x1024x1024")


def timed(kernel, rows: int, q_len: int, k_len: int, generator) -> float:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import sdpa_kernel

    q = torch.randn(rows, 9, q_len, 64, generator=generator).bfloat16().requires_grad_()
    k = torch.randn(rows, 3, k_len, 64, generator=generator).bfloat16().requires_grad_()
    v = torch.randn(rows, 3, k_len, 64, generator=generator).bfloat16().requires_grad_()
    mask = None
    if q_len != k_len:  # query i sees keys up to k_len - q_len + i
        mask = torch.ones(q_len, k_len, dtype=torch.bool).tril(k_len - q_len)
    t0 = time.perf_counter()
    with sdpa_kernel([kernel]):
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None,
                                             enable_gqa=True)
    out.float().sum().backward()
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", nargs="+", default=list(SHAPES), help="rows x queries x keys")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--threads", type=int, default=2)
    resultfile.add_args(ap)
    args = ap.parse_args()
    import torch
    from torch.nn.attention import SDPBackend

    from traingym.models.scoring import MATH_ATTENTION_TOKENS

    rec = resultfile.start("attention_kernels", args)
    torch.set_num_threads(args.threads)
    gen = torch.Generator().manual_seed(0)
    kernels = {"flash": SDPBackend.FLASH_ATTENTION, "math": SDPBackend.MATH}
    rows = []
    for shape in args.shapes:
        b, q_len, k_len = (int(x) for x in shape.split("x"))
        times: dict[str, list[float]] = {name: [] for name in kernels}
        for name, kernel in kernels.items():  # warm-up
            timed(kernel, b, q_len, k_len, gen)
        for r in range(args.rounds):
            order = list(kernels.items())[:: 1 if r % 2 == 0 else -1]
            for name, kernel in order:
                times[name].append(timed(kernel, b, q_len, k_len, gen))
        med = {name: statistics.median(ts) * 1e3 for name, ts in times.items()}
        rows.append({"shape": shape, "rows": b, "queries": q_len, "keys": k_len,
                     "median_ms": med, "flash_over_math": med["flash"] / med["math"],
                     "ms": {n: [t * 1e3 for t in ts] for n, ts in times.items()}})
        print(f"{shape:>12}: flash {med['flash']:8.2f} ms  math {med['math']:8.2f} ms  "
              f"flash/math {med['flash'] / med['math']:.2f}", flush=True)
    rec.write({"torch": torch.__version__, "heads": [9, 3], "head_dim": 64, "dtype": "bfloat16",
               "rounds": args.rounds, "math_attention_tokens": MATH_ATTENTION_TOKENS,
               "shapes": rows})


if __name__ == "__main__":
    main()
