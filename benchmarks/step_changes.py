"""The optimizer step that reports the engine values it changed (trainer/step_changes.py), against
the plain step plus the delta sync's comparison pass, side by side.

The parameters have the shapes of SmolLM2-135M-Instruct (134.5M, built from its config, random
values, fp32) with random gradients; the engine holds their bf16 cast. Each round, on the same
parameters and gradients in two copies:
  plain:   optimizer.step(), then the delta codec's encode against the last published bf16 state,
           finding the changes by comparing the whole cast (extract.cast_changes);
  tracked: ChangeTracking.step() (the same kernel a chunk at a time, bitwise the same weights),
           then the encode reading only the positions it reported (extract.changes_at).
Both encodes must give the same payload bytes (checked each round). Medians over `--rounds`.
The learning rate sets the share of bf16 values a step changes (1e-6: about 1%, as the real RL
step the weight-sync benchmarks use).

    PYTHONPATH=src .venv/bin/python benchmarks/step_changes.py   # -> results/step_changes/
    PYTHONPATH=src .venv/bin/python benchmarks/step_changes.py --rounds 1 --out /tmp/sc.json
"""

from __future__ import annotations

import argparse
import statistics
import time

import resultfile


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--threads", type=int, default=2, help="torch threads (the optimizer)")
    ap.add_argument("--codec-threads", type=int, default=1, help="the delta codec's threads")
    ap.add_argument("--lr", type=float, default=1e-6)
    resultfile.add_args(ap)
    args = ap.parse_args()
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from traingym.models.embedded import embedded_model_dir
    from traingym.trainer.step_changes import ChangeTracking
    from traingym.weights.base import CODECS

    rec = resultfile.start("step_changes", args)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(embedded_model_dir()))
    named = {n: p.detach().float().clone() for n, p in model.named_parameters()}
    del model
    numel = sum(p.numel() for p in named.values())
    sides = {}
    for side in ("plain", "tracked"):
        params = {n: torch.nn.Parameter(p.clone()) for n, p in named.items()}
        opt = torch.optim.AdamW(params.values(), lr=args.lr, weight_decay=0.01, fused=True)
        track = ChangeTracking(opt, {p: [n] for n, p in params.items()}, torch.bfloat16)
        shadow = {n: p.detach().to(torch.bfloat16) for n, p in params.items()}
        sides[side] = (params, opt, track, shadow)
    codec = CODECS.get("delta")(1, args.codec_threads)
    times = {k: [] for k in ("plain_step", "tracked_step", "compare_encode", "hinted_encode")}
    changed = []
    for r in range(args.rounds + 1):  # round 0 untimed: allocates the optimizer state
        g = torch.Generator().manual_seed(r)
        grads = {n: torch.randn(p.shape, generator=g) * 1e-3 for n, p in named.items()}
        payloads = {}
        for side, (params, opt, track, shadow) in sides.items():
            for n, p in params.items():
                p.grad = grads[n]
            track.arm(r)
            t0 = time.perf_counter()
            (track.step if side == "tracked" else opt.step)()
            t1 = time.perf_counter()
            hint = track.take() if side == "tracked" else None
            if side == "plain":
                track.invalidate()
            t2 = time.perf_counter()
            payload, ch = codec.encode_changes(shadow, params, cast=torch.bfloat16,
                                               changed=hint)
            t3 = time.perf_counter()
            codec.write(shadow, ch)  # the shadow becomes this version
            payloads[side] = (b"".join(bytes(b) for b in payload.buffers), ch.n_changed)
            if r:
                times[f"{side}_step"].append(t1 - t0)
                times[("hinted" if hint is not None else "compare") + "_encode"].append(
                    t3 - t2)
        assert payloads["plain"] == payloads["tracked"], "the two encodes differ"
        for (a, _, _, _), (b, _, _, _) in [(sides["plain"], sides["tracked"])]:
            assert all(torch.equal(a[n], b[n]) for n in a), "the two steps differ"
        if r:
            changed.append(payloads["plain"][1] / numel)
    med = {k: statistics.median(v) for k, v in times.items()}
    plain = med["plain_step"] + med["compare_encode"]
    tracked = med["tracked_step"] + med["hinted_encode"]
    res = {"params": numel, "rounds": args.rounds, "lr": args.lr, "threads": args.threads,
           "codec_threads": args.codec_threads, "changed_frac_median": statistics.median(changed),
           "times": times, "median": med, "plain_total_s": plain, "tracked_total_s": tracked,
           "saved_s": plain - tracked, "tracked_over_plain": tracked / plain,
           "bitwise_equal_weights": True, "same_payload": True}
    print({k: round(v, 4) for k, v in med.items()}, f"plain {plain:.4f}s tracked "
          f"{tracked:.4f}s ({tracked / plain:.2f}x), changed {res['changed_frac_median']:.4f}")
    rec.write(res)


if __name__ == "__main__":
    main()
