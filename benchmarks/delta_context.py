"""Which context the receiver already holds would shrink a bf16 RL delta, per stream; and what
the delta codec's streams cost against those bounds.

    python benchmarks/delta_context.py [--steps 20] [--lr 1e-6] [--cache DIR] [--at 1,2,3,20]
        # -> benchmarks/results/delta_context/<date>-<commit>.json
    python benchmarks/delta_context.py --steps 2 --at 1,2 --out /tmp/delta_context_smoke.json

Same workload as benchmarks/weight_sync.py (SmolLM2-135M, AdamW on a policy-gradient
surrogate, bf16 states). For each chosen step, in bits per changed element:
- positions (which elements changed): the zeroth-order entropy N*H(n/N) per tensor; per row
  and per column (two-part: each row's count at its empirical entropy plus log2 C(len, n_r));
  given the old bf16 exponent (every exponent its own Bernoulli, which the receiver can
  compute from its base); with two tiers split at the best exponent threshold (what the
  "tiered" method models); and the codec's position streams as sent.
- tier S: the share of elements below the codec's thresholds, and of the changes in it.
- values (key differences): the per-tensor empirical entropy; given the old exponent; the
  codec's value stream as sent; and the alternative it replaced (exponent class through zstd
  plus raw low bits, in the same order).
Entropies are empirical (the model's description is not counted). A measurement, not a codec.
Writes the raw bit totals and the per-changed-element figures of each step to a new result file
with its provenance (benchmarks/resultfile.py; BENCHMARKS.md "Where the bits go" quotes
benchmarks/results/delta_context/2026-12-03-b367689.json).
"""

import argparse
import math
import sys
from pathlib import Path

import numpy as np
import zstandard

sys.path.insert(0, str(Path(__file__).parent))
import resultfile
from weight_sync import rl_stream  # noqa: E402

from traingym.weights import entropy, tiered  # noqa: E402
from traingym.weights.codecs import DeltaCodec  # noqa: E402
from traingym.weights.extract import changes  # noqa: E402
from traingym.weights.hashing import bits  # noqa: E402

_LGAMMA = np.vectorize(math.lgamma, otypes=[np.float64])


def h(p):
    p = np.asarray(p, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = -(p * np.log2(p) + (1 - p) * np.log2(1 - p))
    return np.nan_to_num(out)


def ent(x: np.ndarray) -> float:
    """Empirical entropy of x in bits, times its length."""
    if x.size == 0:
        return 0.0
    _, c = np.unique(x, return_counts=True)
    return float(-(c * np.log2(c / c.sum())).sum())


def cond_ent(x: np.ndarray, ctx: np.ndarray) -> float:
    """sum over contexts of n_c * H(x | ctx = c), empirical (x below 2^20)."""
    pair = ctx.astype(np.int64) * (1 << 20) + (x.astype(np.int64) & ((1 << 20) - 1))
    return ent(pair) - ent(ctx)


def two_part(count: np.ndarray, length: int) -> float:
    """Bits to say which elements changed, given per-group counts (groups of `length`)."""
    log2_binom = (_LGAMMA(length + 1.0) - _LGAMMA(count + 1.0) - _LGAMMA(length - count + 1.0))
    return float(log2_binom.sum() / math.log(2)) + ent(count)


def measure(old, new) -> dict:
    zc = zstandard.ZstdCompressor(level=1)
    payload = DeltaCodec().encode(old, new)
    r = dict.fromkeys(["n", "N", "pos_h0", "pos_row", "pos_col", "pos_exp", "pos_2tier",
                       "pos_codec", "val_h0", "val_exp", "val_codec", "val_classes",
                       "tier_s", "changed_in_s"], 0.0)
    for e in payload.header.tensors:
        a, b = bits(old[e.name]), bits(new[e.name])
        if a.dtype != np.uint16 or e.method in ("same", "raw", "xor"):
            continue
        pos, a_pos, b_pos = changes(a, b)
        n, N = pos.size, a.size
        r["n"] += n
        r["N"] += N
        r["pos_h0"] += N * float(h(n / N))
        shape = old[e.name].shape
        cols = shape[-1] if len(shape) >= 2 else N
        r["pos_row"] += two_part(np.bincount(pos // cols, minlength=N // cols), cols)
        r["pos_col"] += (two_part(np.bincount(pos % cols, minlength=cols), N // cols)
                         if len(shape) >= 2 else N * float(h(n / N)))
        e_all = tiered.exponents(a, 7).astype(np.int64)
        e_pos = e_all[pos]
        count, hits = np.bincount(e_all, minlength=256), np.bincount(e_pos, minlength=256)
        r["pos_exp"] += float((count * h(hits / np.maximum(count, 1))).sum())
        cs, hs = np.cumsum(count), np.cumsum(hits)  # 2 tiers: exponent < T and the rest
        split = cs * h(hs / np.maximum(cs, 1)) + (N - cs) * h((n - hs) / np.maximum(N - cs, 1))
        r["pos_2tier"] += float(split.min())  # T = 256 (one tier) is the zeroth order
        bufs = [payload.buffers[i] for i in e.buffers]
        if e.method == "tiered":
            pos_bytes = sum(e.params[7:])
            val_bytes = bufs[0].nbytes - pos_bytes
            in_s = e_pos < e.params[0]
            r["tier_s"] += int(count[: e.params[0]].sum())
            r["changed_in_s"] += int(in_s.sum())
            order = np.concatenate([np.flatnonzero(in_s)[np.argsort(e_pos[in_s], kind="stable")],
                                    np.flatnonzero(~in_s)])
        else:
            pos_bytes = sum(x.nbytes for x in bufs[:3])
            val_bytes = sum(x.nbytes for x in bufs[3:])
            order = np.arange(n)
        r["pos_codec"] += 8 * pos_bytes
        r["val_codec"] += 8 * val_bytes
        d = (entropy.float_key(b_pos) - entropy.float_key(a_pos)).view(np.int16).astype(np.int64)
        r["val_h0"] += ent(d)
        r["val_exp"] += cond_ent(d, e_pos)
        classes, mantissa = entropy.class_encode(entropy.zigzag(d[order]) - np.uint64(1))
        r["val_classes"] += 8 * (len(zc.compress(classes)) + len(mantissa))
    return r


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--lr", type=float, default=1e-6)
    ap.add_argument("--cache", help="state cache folder, as in weight_sync.py")
    ap.add_argument("--at", default="1,2,3,20", help="steps to measure")
    resultfile.add_args(ap)
    args = ap.parse_args()
    rec = resultfile.start("delta_context", args)
    states = rl_stream(args.steps, args.lr, args.cache)
    steps = {}
    for i in (int(x) for x in args.at.split(",")):
        r = measure(states[i - 1], states[i])
        f = {k: v / r["n"] for k, v in r.items()}
        steps[i] = {"totals": r, "changed_frac": r["n"] / r["N"],
                    "tier_s_elements_frac": r["tier_s"] / r["N"],
                    "tier_s_changes_frac": r["changed_in_s"] / r["n"],
                    "bits_per_changed": {k: v for k, v in f.items()
                                         if k.startswith(("pos_", "val_"))}}
        print(f"step {i}: {100 * r['n'] / r['N']:.2f}% of the sparse-coded bf16 elements changed; "
              "bits per changed element")
        print(f"  tier S (below the tiered tensors' thresholds): "
              f"{100 * r['tier_s'] / r['N']:.2f}% of the elements, "
              f"{100 * r['changed_in_s'] / r['n']:.0f}% of the changes")
        print("  positions: zeroth-order {pos_h0:.2f}  per row {pos_row:.2f}  per column "
              "{pos_col:.2f}  given old exponent {pos_exp:.2f}  two tiers {pos_2tier:.2f}  "
              "codec {pos_codec:.2f}".format(**f))
        print("  values:    zeroth-order {val_h0:.2f}  given old exponent {val_exp:.2f}  "
              "codec {val_codec:.2f}  (class + raw low bits instead: {val_classes:.2f})"
              .format(**f), flush=True)
    rec.write({"args": {k: v for k, v in vars(args).items() if k != "cache"}, "steps": steps})


if __name__ == "__main__":
    main()
