"""What one decode step's small element-wise ops cost with 1 and with 2 torch threads.

The built-in engine's decode step at batch B runs dozens of element-wise ops per layer on
(B, 1, hidden) tensors. torch splits an element-wise op across its threads once the tensor has
more than 32,768 elements (at::internal::GRAIN_SIZE): at batch 64 a (64, 1, 576) tensor has
36,864, so each op waits on both threads, and on a machine whose other core is busy that wait
dominates. This script times the same ops at batch 16 and 64 with 1 and 2 threads, alternating,
and writes a new result file with its provenance (benchmarks/resultfile.py: the load average,
the commit, ...):

    .venv/bin/python benchmarks/small_op_threads.py   # -> benchmarks/results/small_op_threads/
    .venv/bin/python benchmarks/small_op_threads.py --rounds 1 --calls 20 \
        --out /tmp/small_op_threads.json              # smoke

Microseconds per op, median of --rounds rounds of --calls calls each.
"""

import argparse
import statistics
import time

import resultfile
import torch
import torch.nn.functional as F

HIDDEN, MLP = 576, 1536  # the embedded SmolLM2-135M's widths


def ops(batch: int) -> dict:
    a, b = torch.randn(batch, 1, HIDDEN), torch.randn(batch, 1, HIDDEN)
    m = torch.randn(batch, 1, MLP)
    return {"add (B,1,576)": lambda: a + b, "mul (B,1,576)": lambda: a * b,
            "silu (B,1,1536)": lambda: F.silu(m)}


def time_us(fn, calls: int) -> float:
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t0) / calls * 1e6


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--calls", type=int, default=500)
    resultfile.add_args(ap)
    args = ap.parse_args()
    rec = resultfile.start("small_op_threads", args)
    results: dict = {}
    for batch in (16, 64):
        for name, fn in ops(batch).items():
            for threads in (1, 2):
                torch.set_num_threads(threads)
                time_us(fn, 50)  # warm-up
            samples = {1: [], 2: []}
            for _ in range(args.rounds):
                for threads in (1, 2):
                    torch.set_num_threads(threads)
                    samples[threads].append(time_us(fn, args.calls))
            key = f"batch {batch}: {name}"
            results[key] = {f"{t}_threads_us": statistics.median(s) for t, s in samples.items()}
            print(key, {k: round(v, 1) for k, v in results[key].items()})
    rec.write({"torch": torch.__version__, "median_us": results})


if __name__ == "__main__":
    main()
