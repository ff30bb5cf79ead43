"""Peak memory of one trainer step with and without gradient checkpointing.

Each setting runs in a fresh child process: load the model (--model, default 'embedded', fp32),
build a synthetic batch (--groups groups x --group-size samples, --prompt-len prompt tokens,
--completion-len completion tokens, fixed random ids, advantages (i + 1) / G - 0.3), then run the trainer's
forward/backward over it (TorchTrainer.accumulate, all groups in one micro-batch, no optimizer
step) and report the process's peak RSS (ru_maxrss) before and after that pass; the figure is
the increase, i.e. the pass's activations and gradients (the model's weights are loaded before
the 'before' reading). Settings:

- shared_prompt: the default path (trainer/logprobs.py: each prompt once, KV cache repeated);
- full_rows: trainer/micro.py sequence_logprobs without checkpointing (the path checkpointing
  must use, since Hugging Face drops the KV cache under checkpointing);
- full_rows_checkpointed: `trainer.gradient_checkpointing = true`.

Writes a new result file (benchmarks/resultfile.py) with each setting's RSS before/after/increase
(MiB), seconds of the pass, the loss (the three must agree), and its provenance (the commit, the
load average, ...). Peak RSS is a process-wide high-water mark: allocator caching can hide
a saving smaller than its granularity, and one pass is one sample of the timing.

    PYTHONPATH=src .venv/bin/python benchmarks/grad_ckpt_memory.py
        # -> benchmarks/results/grad_ckpt_memory/<date>-<commit>.json
    PYTHONPATH=src .venv/bin/python benchmarks/grad_ckpt_memory.py --model tiny --out /tmp/x.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import resultfile

SETTINGS = {"shared_prompt": {}, "full_rows": {"full_rows": True},
            "full_rows_checkpointed": {"gradient_checkpointing": True}}


def child(args) -> dict:
    import random
    import resource

    import torch

    from traingym.trainer.config import TrainerConfig
    from traingym.models.loader import load_policy
    from traingym.trainer.micro import sequence_logprobs
    from traingym.trainer.torch_trainer import TorchTrainer, batch_tokens
    from traingym.core.types import Batch, Group, Sample

    torch.set_num_threads(args.threads)
    model, tok = load_policy(args.model)
    rng = random.Random(0)
    vocab = model.config.vocab_size
    groups, adv = [], []
    for gi in range(args.groups):
        prompt = tuple(rng.randrange(10, vocab) for _ in range(args.prompt_len))
        samples = [Sample(prompt, [rng.randrange(10, vocab) for _ in range(args.completion_len)],
                          [-1.0] * args.completion_len, [0] * args.completion_len, {})
                   for _ in range(args.group_size)]
        groups.append(Group(samples, gi))
        adv.append([(i + 1) / args.group_size - 0.3 for i in range(args.group_size)])
    batch = Batch(groups, adv)
    setting = SETTINGS[args.setting]
    cfg = TrainerConfig(bf16_autocast=False, micro_batch_groups=args.groups,
                        gradient_checkpointing=setting.get("gradient_checkpointing", False))
    trainer = TorchTrainer(model, cfg, 1.0, tok.pad_token_id)
    if setting.get("full_rows"):
        trainer.logprobs = sequence_logprobs
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    t0 = time.perf_counter()
    stats = trainer.accumulate(batch.groups, batch.advantages_G, batch_tokens(batch))
    seconds = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"rss_before_mib": round(before, 1), "rss_after_mib": round(after, 1),
            "increase_mib": round(after - before, 1), "seconds": round(seconds, 2),
            "loss": stats["loss"]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="embedded")
    ap.add_argument("--groups", type=int, default=4)
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--completion-len", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    resultfile.add_args(ap)
    ap.add_argument("--setting", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.setting:
        print(json.dumps(child(args)))
        return
    rec = resultfile.start("grad_ckpt_memory", args)
    results = {}
    for name in SETTINGS:
        cmd = [sys.executable, __file__, "--setting", name] + [
            f"--{k.replace('_', '-')}={v}" for k, v in vars(args).items()
            if k not in ("setting", "out", "label")]
        out = subprocess.run(cmd, capture_output=True, text=True, env=os.environ)
        if out.returncode:
            raise SystemExit(f"{name} failed:\n{out.stderr[-3000:]}")
        results[name] = json.loads(out.stdout.strip().splitlines()[-1])
        print(name, results[name], flush=True)
    record = {"args": {k: v for k, v in vars(args).items() if k != "setting"},
              "settings": results}
    rec.write(record)


if __name__ == "__main__":
    main()
