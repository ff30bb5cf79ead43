"""How much the changed positions of a bf16 RL update would shrink if coded given the base.

    python benchmarks/position_context.py [--steps 3] [--lr 1e-6]

Same workload as benchmarks/weight_sync.py (SmolLM2-135M, AdamW on a policy-gradient
surrogate, bf16 states). For the step closest to 1% density it prints the zeroth-order entropy
of "which elements changed" (N*H(n/N) per tensor, what the delta codec's gap coding is within
5-7% of) and the entropy of the same given each element's old bf16 exponent, which the receiver
already holds: a small |w| has a small ulp, so its bf16 value changes more often. Both in bits
per changed element. A measurement of headroom, not a codec.
"""

import argparse
import math
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).parent))
from weight_sync import rl_stream  # noqa: E402


def h(p: float) -> float:
    return 0.0 if p <= 0 or p >= 1 else -(p * math.log2(p) + (1 - p) * math.log2(1 - p))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--lr", type=float, default=1e-6)
    args = ap.parse_args()
    states = rl_stream(args.steps, args.lr)
    pairs = list(zip(states, states[1:]))
    dens = [sum(int((a[k] != b[k]).sum()) for k in a) / sum(a[k].numel() for k in a)
            for a, b in pairs]
    i = int(np.argmin([abs(d - 0.01) for d in dens]))
    old, new = pairs[i]
    plain = given = changed = 0.0
    for k in old:
        a = old[k].view(torch.int16).numpy().view(np.uint16).reshape(-1)
        b = new[k].view(torch.int16).numpy().view(np.uint16).reshape(-1)
        ch = a != b
        n = int(ch.sum())
        changed += n
        plain += a.size * h(n / a.size)
        e = ((a >> 7) & 0xFF).astype(np.int64)
        count, hits = np.bincount(e, minlength=256), np.bincount(e[ch], minlength=256)
        given += sum(c * h(x / c) for c, x in zip(count, hits) if c)
    print(f"step {i + 1}, {100 * dens[i]:.2f}% changed: position bits per changed element: "
          f"zeroth-order {plain / changed:.2f}, given the old exponent {given / changed:.2f}")


if __name__ == "__main__":
    main()
