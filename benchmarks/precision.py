"""What 'auto' precision chooses on this machine, and why: one train step and one engine call of
the embedded model in fp32 and in bf16, side by side (alternating, after a warm-up of each).

    python benchmarks/precision.py [--new-tokens 8] [--reps 2]
        # -> benchmarks/results/precision/<date>-<commit>.json
    python benchmarks/precision.py --prompts 2 --group 2 --new-tokens 2 --reps 1 \
        --out /tmp/precision_smoke.json                               # smoke

Train step: the trainer's own step (TorchTrainer.train_step: forward, backward, AdamW) on a
batch of the default run's shape (16 arith prompts x 4 samples of --new-tokens completion
tokens), with trainer.bf16_autocast False and True. Engine: TorchEngine.generate_sync on the
same 16 prompts x 4 samples, engine weights fp32 and bf16. Writes the median of --reps timed
repetitions per setting, the ratios bf16/fp32, whether oneDNN reports bf16 kernels
(precision.fast_bf16) and what 'auto' picks, with the result file's provenance
(benchmarks/resultfile.py: the load average before and after, the commit, ...).
"""

import argparse
import copy
import json
import platform
import statistics
import time

import resultfile
import torch

from traingym.trainer.config import TrainerConfig
from traingym.envs.render import PromptRenderer
from traingym.envs.tasks import builtin_task
from traingym.models.loader import load_policy
from traingym.core.precision import autocast_bf16, engine_dtype, fast_bf16
from traingym.rollout.torch_engine import TorchEngine
from traingym.trainer.torch_trainer import TorchTrainer
from traingym.core.types import Batch, GenerationRequest, Group, Sample, SamplingParams


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--group", type=int, default=4)
    ap.add_argument("--new-tokens", type=int, default=8)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    resultfile.add_args(ap)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    rec = resultfile.start("precision", args)
    model, tok = load_policy("embedded")
    prompts = [PromptRenderer(tok).ids(r) for r in builtin_task("arith").heldout[: args.prompts]]
    params = SamplingParams(1.0, max_new_tokens=args.new_tokens)
    reqs = [GenerationRequest(p, args.group, params, seed=i) for i, p in enumerate(prompts)]
    engines = {name: TorchEngine(copy.deepcopy(model), tok.pad_token_id, 64, dtype)
               for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16))}
    groups = [Group([Sample(tuple(c.prompt_ids), c.token_ids, c.logprobs, [0] * len(c.token_ids),
                            {}) for c in comps], i)
              for i, comps in enumerate(engines["fp32"].generate_sync(reqs))]
    batch = Batch(groups, [[1.0, -1.0] * (args.group // 2) + [0.0] * (args.group % 2)
                           for _ in groups])
    trainers = {name: TorchTrainer(copy.deepcopy(model), TrainerConfig(lr=1e-7, bf16_autocast=ac),
                                   1.0, tok.pad_token_id)
                for name, ac in (("fp32", False), ("bf16", True))}
    times = {f"{what}_{name}": [] for what in ("train_step", "generate") for name in engines}
    for rep in range(args.reps + 1):  # rep 0 warms each setting up and is not kept
        for name in ("fp32", "bf16"):
            for what, call in (("train_step", lambda: trainers[name].train_step(batch)),
                               ("generate", lambda: engines[name].generate_sync(reqs))):
                t0 = time.perf_counter()
                call()
                dt = time.perf_counter() - t0
                print(f"rep {rep} {what} {name}: {dt:.2f} s", flush=True)
                if rep:
                    times[f"{what}_{name}"].append(dt)
    med = {k: statistics.median(v) for k, v in times.items()}
    result = {
        "command": "python benchmarks/precision.py " + " ".join(
            f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items()
            if k not in ("out", "label")),
        "machine": {"cpu": platform.processor() or platform.machine(), "threads": args.threads,
                    "torch": torch.__version__,
                    "cpu_capability": torch.backends.cpu.get_cpu_capability(),
                    "onednn_bf16_kernels": fast_bf16("cpu")},
        "auto_picks": {"engine_dtype": str(engine_dtype("auto")),
                       "bf16_autocast": autocast_bf16("auto")},
        "batch": {"prompts": args.prompts, "group": args.group, "new_tokens": args.new_tokens},
        "seconds_median": med, "seconds_all": times,
        "bf16_over_fp32": {w: med[f"{w}_bf16"] / med[f"{w}_fp32"]
                           for w in ("train_step", "generate")},
    }
    rec.write(result)
    print(json.dumps(result["bf16_over_fp32"]), json.dumps(med))


if __name__ == "__main__":
    main()
