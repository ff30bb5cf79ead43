"""The delta codec before and after a change, side by side: encode and apply of one real RL
delta, timed in fresh processes that alternate between two source trees.

The delta is weight_sync.py's: step 2 -> step 3 of the embedded model's bf16 RL stream (AdamW
lr 1e-6, 1.13% of the elements changed), tiled --copies times (4: the 1.08 GB state of the TCP
runs). Each process codes it --deltas times, alternating old -> new and new -> old (the same
change both ways), with `DeltaCodec(threads).encode_changes` and applies each payload to a copy
of its base with `apply_changes`; the first two deltas warm up (first-touch page faults of the
fresh arrays) and are not counted. Per process it reports medians of the encode wall time and
its phases (extract, code, verify: CPU seconds summed over threads) and of the apply wall
time and its phases (decode, apply). --link-mbps tells the encoder the link's speed where
its tree takes it (the link-aware plan, tiered.scan_bits); an older tree codes for the fewest
bytes, as it would on that link. "before" is a git worktree of --before with its C kernels
built in place (setup.py build_ext --inplace); "after" is this checkout (its kernels as
installed). Both run this file's --measure code with PYTHONPATH on their own src, in the same
venv, --rounds times each, alternating, so a slow phase of the shared machine falls on both.
Writes a new result file with its provenance (benchmarks/resultfile.py; --label names a variant,
e.g. link_t1).

    PYTHONPATH=src .venv/bin/python benchmarks/codec_before_after.py --before 6a7ee36 \\
        --cache /tmp/ws_cache          # -> benchmarks/results/codec_before_after/
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import resultfile

ROOT = Path(__file__).resolve().parents[1]


def measure(cache: str, copies: int, threads: int, deltas: int, link_mbps: float) -> dict:
    import inspect

    import torch

    torch.set_num_threads(1)
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from weight_sync import rl_stream

    from traingym.weights import codecs, native
    from traingym.weights.codecs import DeltaCodec, apply_changes

    states = rl_stream(3, 1e-6, cache)
    old = {f"{i}.{k}": v.clone() for i in range(copies) for k, v in states[2].items()}
    new = {f"{i}.{k}": v.clone() for i in range(copies) for k, v in states[3].items()}
    del states
    codec, rows = DeltaCodec(threads=threads), []
    # a tree that predates the link-aware plan codes for the fewest bytes whatever the link
    link = {"link_s_per_byte": 8 / (link_mbps * 1e6)} if link_mbps and "link_s_per_byte" \
        in inspect.signature(codec.encode_changes).parameters else {}
    for d in range(deltas):
        src, dst = (old, new) if d % 2 == 0 else (new, old)
        t0 = time.perf_counter()
        payload, sent = codec.encode_changes(src, dst, **link)
        encode_s = time.perf_counter() - t0
        base = {k: v.clone() for k, v in src.items()}
        t0 = time.perf_counter()
        got, applied = apply_changes(base, payload, threads)
        apply_s = time.perf_counter() - t0
        assert all(torch.equal(got[k], dst[k]) for k in dst), "the delta did not reproduce"
        if d >= 2:
            rows.append({"encode_s": encode_s, "apply_s": apply_s,
                         "bytes": sum(b.nbytes for b in payload.buffers),
                         **{f"encode_{k}_s": v for k, v in sent.times.items()},
                         **{f"apply_{k}_s": v for k, v in applied.times.items()}})
    med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
    return {"codecs_py": codecs.__file__, "native": native.lib is not None, "link": link,
            "changed": sent.n_changed, "median": med, "deltas": rows}


def build(tree: Path) -> None:
    subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace"], cwd=tree,
                   check=True, capture_output=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--before", default="6a7ee36", help="commit to compare this checkout with")
    ap.add_argument("--cache", default="/tmp/ws_cache", help="weight_sync.py's state cache")
    ap.add_argument("--copies", type=int, default=4)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--deltas", type=int, default=6, help="per process; the first 2 warm up")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--link-mbps", type=float, default=0.0,
                    help="the link the encoder is told of (Mbit/s; 0: none, fewest bytes), "
                         "where its tree takes one")
    resultfile.add_args(ap)
    ap.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.deltas < 3:
        ap.error("--deltas must be at least 3 (two warm up)")
    if args.measure:
        print(json.dumps(measure(args.cache, args.copies, args.threads, args.deltas,
                                 args.link_mbps)))
        return
    rec = resultfile.start("codec_before_after", args)
    with tempfile.TemporaryDirectory() as tmp:
        before = Path(tmp) / "before"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(before),
                        args.before], check=True, capture_output=True)
        try:
            build(before)
            trees = {"before": before, "after": ROOT}
            commits = {k: subprocess.run(["git", "-C", str(t), "rev-parse", "HEAD"],
                                         capture_output=True, text=True).stdout.strip()
                       for k, t in trees.items()}
            runs: dict[str, list] = {"before": [], "after": []}
            for r in range(args.rounds):
                for side, tree in trees.items():
                    env = {**os.environ, "PYTHONPATH": str(tree / "src"),
                           "OMP_NUM_THREADS": "1"}
                    cmd = [sys.executable, __file__, "--measure", "--cache", args.cache,
                           "--copies", str(args.copies), "--threads", str(args.threads),
                           "--deltas", str(args.deltas), "--link-mbps", str(args.link_mbps)]
                    out = subprocess.run(cmd, env=env, capture_output=True, text=True,
                                         check=True).stdout
                    res = json.loads(out.strip().splitlines()[-1])
                    res["loadavg_after"] = os.getloadavg()
                    runs[side].append(res)
                    m = res["median"]
                    print(f"round {r} {side:6s} encode {m['encode_s']:.3f}s (code "
                          f"{m.get('encode_code_s', 0):.3f}) apply {m['apply_s']:.3f}s (decode "
                          f"{m.get('apply_decode_s', 0):.3f})  {res['codecs_py']}", flush=True)
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force",
                            str(before)], capture_output=True)
    summary = {side: {k: statistics.median(r["median"][k] for r in rs)
                      for k in rs[0]["median"]} for side, rs in runs.items()}
    for k in ("encode_s", "apply_s"):
        summary[f"after_over_before_{k}"] = summary["after"][k] / summary["before"][k]
    result = {"commits": commits, "copies": args.copies, "threads": args.threads,
              "link_mbps": args.link_mbps,
              "deltas_per_process": args.deltas, "rounds": args.rounds,
              "summary": summary, "runs": runs}
    print(json.dumps(summary, indent=1))
    rec.write(result)


if __name__ == "__main__":
    main()
