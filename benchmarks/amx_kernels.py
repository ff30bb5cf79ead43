"""The AMX kernels (rollout/amx.py) against oneDNN, the path they replace, in three parts:

- `call_us`: one bf16 linear call, oneDNN's pre-packed `_linear_pointwise` against `amx.linear`,
  by shape and rows (median of --repeats timings of 200 calls each, after a warm-up). A 64 x 64
  weight shows the fixed cost per call.
- `bits`: the fraction of output elements where `amx.linear` differs from `F.linear` (oneDNN),
  and where oneDNN's own batch differs from the same rows one at a time, by rows, on a 1536 x 768
  weight.
- `engine`: the built-in engine on the embedded model in bf16 (fused decoder), kernels on and off
  (off: built as where the module is absent), T=1 and 64 new tokens from the arith task's prompts,
  by rows; --rounds interleaved rounds after one warm-up call each, medians of tokens/s.

    PYTHONPATH=src .venv/bin/python benchmarks/amx_kernels.py   # -> benchmarks/results/amx_kernels/
    PYTHONPATH=src .venv/bin/python benchmarks/amx_kernels.py --rounds 1 --rows 4 \\
        --out /tmp/amx_kernels.json                               # smoke

Needs a CPU where the kernels run (amx.runs()); refuses to run elsewhere.
"""

from __future__ import annotations

import argparse
import statistics
import time

import resultfile

SHAPES = [(64, 64), (768, 384), (768, 768), (1536, 768)]  # (out, in) features


def _median_us(fn, calls: int, repeats: int) -> float:
    for _ in range(10):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - t0) / calls * 1e6)
    return statistics.median(times)


def call_us(repeats: int) -> list[dict]:
    import torch

    from traingym.rollout import amx

    g, out = torch.Generator().manual_seed(0), []
    for n, k in SHAPES:
        w = (torch.randn(n, k, generator=g) * k ** -0.5).bfloat16()
        onednn, packed = torch.ops.mkldnn._reorder_linear_weight(w, 16), amx.pack(w)
        for rows in (1, 7, 16):
            x = torch.randn(rows, k, generator=g).bfloat16()
            out.append({"out": n, "in": k, "rows": rows,
                        "onednn_us": _median_us(lambda: torch.ops.mkldnn._linear_pointwise(
                            x, onednn, None, "none", [], ""), 200, repeats),
                        "amx_us": _median_us(lambda: amx.linear(x, packed), 200, repeats)})
    return out


def bits() -> list[dict]:
    import torch
    import torch.nn.functional as F

    from traingym.rollout import amx

    g = torch.Generator().manual_seed(1)
    w = (torch.randn(1536, 768, generator=g) * 768 ** -0.5).bfloat16()
    packed, out = amx.pack(w), []
    for rows in (16, 32, 33, 64, 200, 352):
        x = torch.randn(rows, 768, generator=g).bfloat16()
        batch = F.linear(x, w)
        alone = torch.cat([F.linear(x[i:i + 1], w) for i in range(rows)])
        ours = amx.linear(x, packed)
        out.append({"rows": rows,
                    "amx_differs_from_onednn": (ours != batch).float().mean().item(),
                    "onednn_batch_differs_from_rows_alone": (batch != alone).float().mean().item()})
    return out


def engine(rows_list: list[int], rounds: int) -> dict:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from traingym.core.types import GenerationRequest, SamplingParams
    from traingym.envs.render import PromptRenderer
    from traingym.envs.tasks import builtin_task
    from traingym.models.embedded import embedded_model_dir
    from traingym.rollout import amx
    from traingym.rollout.torch_engine import TorchEngine

    folder = embedded_model_dir()
    tok = AutoTokenizer.from_pretrained(folder)

    def build():
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16)
        return TorchEngine(model, tok.pad_token_id, fused=True)

    engines = {"on": build()}
    lib, amx.lib = amx.lib, None
    try:
        engines["off"] = build()
    finally:
        amx.lib = lib
    assert engines["on"].fused.kernel and not engines["off"].fused.kernel
    rows_out = {}
    heldout = builtin_task("arith").heldout
    for rows in rows_list:
        prompts = [PromptRenderer(tok).ids(heldout[i % len(heldout)]) for i in range(rows)]
        reqs = [GenerationRequest(p, 1, SamplingParams(1.0, max_new_tokens=64), i)
                for i, p in enumerate(prompts)]
        tps = {name: [] for name in engines}
        for e in engines.values():
            e.generate_sync(reqs)  # warm-up
        for r in range(rounds):
            for name in (("on", "off") if r % 2 == 0 else ("off", "on")):
                t0 = time.perf_counter()
                done = engines[name].generate_sync(reqs)
                tps[name].append(sum(len(c[0].token_ids) for c in done)
                                 / (time.perf_counter() - t0))
        med = {name: statistics.median(v) for name, v in tps.items()}
        rows_out[f"rows_{rows}"] = {"tokens_per_s": tps, "median_tokens_per_s": med,
                                    "on_over_off": med["on"] / med["off"]}
    return rows_out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--rows", type=int, nargs="+", default=[16, 64])
    resultfile.add_args(ap)
    args = ap.parse_args()
    import torch

    from traingym.rollout import amx

    if not amx.runs():
        raise SystemExit("the AMX kernels do not run here (amx.runs() is False): no comparison")
    rec = resultfile.start("amx_kernels", args)
    torch.set_num_threads(args.threads)
    res = {"threads": args.threads, "call_us": call_us(args.repeats), "bits": bits(),
           "engine": {"model": "embedded (SmolLM2-135M)", "dtype": "bfloat16",
                      "temperature": 1.0, "new_tokens": 64, "rounds": args.rounds,
                      **engine(args.rows, args.rounds)}}
    for c in res["call_us"]:
        print(f"linear {c['out']}x{c['in']}, {c['rows']} rows: oneDNN {c['onednn_us']:.1f} us, "
              f"amx {c['amx_us']:.1f} us")
    for b in res["bits"]:
        print(f"{b['rows']} rows: amx != oneDNN {b['amx_differs_from_onednn']:.2%}, oneDNN batch "
              f"!= rows alone {b['onednn_batch_differs_from_rows_alone']:.2%}")
    for key in (k for k in res["engine"] if k.startswith("rows_")):
        e = res["engine"][key]
        print(f"engine {key}: on {e['median_tokens_per_s']['on']:.1f} tok/s, off "
              f"{e['median_tokens_per_s']['off']:.1f} tok/s, {e['on_over_off']:.2f}x")
    rec.write(res)


if __name__ == "__main__":
    main()
