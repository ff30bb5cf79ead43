"""Training throughput: traingym's trainer against TRL's GRPOTrainer on the same batch, side by
side in one process (issue 13, acceptance 6).

    python benchmarks/trainer_throughput.py                          # 16 x 4 x 8, 5 timed steps
        # -> benchmarks/results/trainer_throughput/<date>-<commit>.json (benchmarks/resultfile.py)
    python benchmarks/trainer_throughput.py --prompts 4 --steps 1 --out /tmp/tt.json  # smoke

Only the train step is timed: forward, backward and the optimizer (grad-norm clip + AdamW), on
a batch that is already there; no generation, no reward, no weight sync. Steps alternate
(traingym, TRL, traingym, TRL, ...) so that other jobs on the machine slow both sides alike;
the first --warmup rounds are not kept; the median of --steps rounds is reported as seconds
per step and as trained tokens per second (trained tokens: completion tokens with loss, the
same count on both sides), with the ratio traingym/TRL.

Equal on both sides: the embedded SmolLM2-135M-Instruct (traingym.models.embedded, the same
safetensors folder, loaded in fp32; this CPU has no fast bf16 kernels, benchmarks/precision.py,
so no autocast on either side), the same sequences (--prompts arith prompts rendered by
traingym's PromptRenderer, all of the same token length, each repeated --group times, with
--new-tokens completion token ids drawn at random from the vocabulary, no padding anywhere),
the same per-sample advantages (drawn from +-[0.5, 1.5], nonzero for every sample, so no group
is dropped and every completion token carries loss), the same loss (PPO clip 0.2/0.28,
token-level averaging over the whole batch's tokens: traingym's GRPO, TRL's loss_type="dapo";
no KL, beta=0), micro-batches of --micro-groups groups (traingym
trainer.micro_batch_groups; TRL per_device_train_batch_size = micro-groups x group with
gradient_accumulation_steps = prompts / micro-groups), one AdamW step per batch (lr --lr,
betas 0.9/0.99, no weight decay, grad-norm clip 1.0), gradient checkpointing off, --threads
torch threads (one process). Both models start from the same weights, so the first step's
loss and gradient norm must agree: they are printed and recorded as a check that the two
sides compute the same update (the loss's value is the same at every step, -mean advantage,
since one step per batch makes every ratio 1; the gradient norms of later steps show whether
the two models still follow the same updates).

The TRL side runs TRL's own code: GRPOTrainer.compute_loss (-> _compute_loss ->
_get_per_token_logps_and_entropies, with TRL's fused LM head) on inputs laid out as
_generate_and_score_completions returns them (prompt_ids/prompt_mask, completion_ids/
completion_mask, advantages, num_items_in_batch), under compute_loss_context_manager, then
accelerator.backward, per micro-batch: the body of transformers' Trainer.training_step (which
itself cannot be called here: it calls GRPOTrainer._prepare_inputs, which generates); then,
as transformers' inner training loop does, accelerator.clip_grad_norm_, optimizer.step and
model.zero_grad, with the optimizer GRPOTrainer.create_optimizer builds from its config
(transformers' default, adamw_torch_fused). traingym's side is TorchTrainer.train_step (its
AdamW is torch's with foreach=True): the only optimizer difference, recorded in the result.

Not equal, because the frameworks differ inside (which is what is measured): traingym runs
each group's prompt once and repeats its KV cache for the group's completions
(trainer/logprobs.py) and puts only completion positions through the LM head; TRL runs every
row as a full prompt + completion sequence and puts the completion positions through its fused
LM head.
"""

from __future__ import annotations

import argparse
import copy
import os
import platform
import random
import statistics
import time
from collections import Counter
from pathlib import Path

import resultfile
import torch

CLIP_LOW, CLIP_HIGH, BETAS, GRAD_CLIP = 0.2, 0.28, (0.9, 0.99), 1.0


def fixed_length_prompts(tok, count: int) -> list[tuple[int, ...]]:
    """`count` arith prompts (chat template + pre-fill) of the most common token length."""
    from traingym.envs.render import PromptRenderer
    from traingym.envs.tasks import builtin_task

    renderer = PromptRenderer(tok, "The answer is")
    prompts = [renderer.ids(r) for r in builtin_task("arith").train[: max(64, 8 * count)]]
    length = Counter(len(p) for p in prompts).most_common(1)[0][0]
    same = [p for p in prompts if len(p) == length]
    if len(same) < count:
        raise SystemExit(f"only {len(same)} arith prompts of {length} tokens; lower --prompts")
    return same[:count]


def make_data(a, tok) -> tuple[list, list, list]:
    """(prompts, completions[p][g], advantages[p][g]): the one batch both sides train on."""
    rng = random.Random(a.seed)
    prompts = fixed_length_prompts(tok, a.prompts)
    completions = [[[rng.randrange(tok.vocab_size) for _ in range(a.new_tokens)]
                    for _ in range(a.group)] for _ in prompts]
    advantages = [[rng.choice((-1, 1)) * rng.uniform(0.5, 1.5) for _ in range(a.group)]
                  for _ in prompts]
    return prompts, completions, advantages


def traingym_side(a, model, tok, data):
    """A callable running one TorchTrainer.train_step on the batch; its metrics."""
    from traingym.algorithms.grpo import GRPO
    from traingym.trainer.config import TrainerConfig
    from traingym.trainer.torch_trainer import TorchTrainer
    from traingym.core.types import Batch, Group, Sample

    prompts, completions, advantages = data
    groups = [Group([Sample(p, list(c), [0.0] * len(c), [0] * len(c), {}) for c in comps], i)
              for i, (p, comps) in enumerate(zip(prompts, completions))]
    batch = Batch(groups, advantages)
    algo = GRPO()
    assert (algo.knobs.clip_low, algo.knobs.clip_high) == (CLIP_LOW, CLIP_HIGH)
    assert not algo.knobs.normalize_std and algo.knobs.kl_coef == 0
    cfg = TrainerConfig(lr=a.lr, betas=BETAS, weight_decay=0.0, grad_clip=GRAD_CLIP,
                        micro_batch_groups=a.micro_groups, bf16_autocast=False,
                        gradient_checkpointing=False)
    trainer = TorchTrainer(model, cfg, 1.0, tok.pad_token_id, algorithm=algo)

    def step() -> dict:
        m = trainer.train_step(batch)
        return {"loss": m["loss"], "grad_norm": m["grad_norm"], "tokens": m["trained_tokens"]}

    return step, type(trainer.optimizer).__name__ + " (foreach=True)"


def trl_side(a, model, tok, data, work: Path):
    """A callable running one TRL step (compute_loss + backward per micro-batch, clip, AdamW)."""
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    prompts, completions, advantages = data
    rows = a.micro_groups * a.group
    args = GRPOConfig(
        output_dir=str(work), use_cpu=True, per_device_train_batch_size=rows,
        gradient_accumulation_steps=a.prompts // a.micro_groups, num_generations=a.group,
        num_iterations=1, max_completion_length=a.new_tokens, temperature=1.0,
        learning_rate=a.lr, lr_scheduler_type="constant", warmup_steps=0,
        adam_beta1=BETAS[0], adam_beta2=BETAS[1], weight_decay=0.0, max_grad_norm=GRAD_CLIP,
        beta=0.0, epsilon=CLIP_LOW, epsilon_high=CLIP_HIGH, loss_type="dapo",
        scale_rewards="none", bf16=False, fp16=False, gradient_checkpointing=False,
        report_to="none", save_strategy="no", disable_tqdm=True, dataloader_num_workers=0,
        log_completions=False, seed=a.seed)
    dummy = Dataset.from_list([{"prompt": "x"}] * a.prompts)
    trainer = GRPOTrainer(model=model, reward_funcs=lambda completions, **_: [0.0] * len(
        completions), args=args, train_dataset=dummy, processing_class=tok)
    assert trainer.loss_type == "dapo" and trainer.beta == 0.0
    trainer.create_optimizer()
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = args.gradient_accumulation_steps
    trained = a.prompts * a.group * a.new_tokens
    # rows group-major (prompt p, sample g), as TRL lays out its generation batch
    p_ids = torch.tensor([p for p in prompts for _ in range(a.group)])
    c_ids = torch.tensor([c for comps in completions for c in comps])
    adv = torch.tensor([x for advs in advantages for x in advs], dtype=torch.float32)
    micro = [{"prompt_ids": p_ids[i : i + rows],
              "prompt_mask": torch.ones_like(p_ids[i : i + rows]),
              "completion_ids": c_ids[i : i + rows],
              "completion_mask": torch.ones_like(c_ids[i : i + rows]),
              "advantages": adv[i : i + rows], "num_items_in_batch": torch.tensor(trained)}
             for i in range(0, len(p_ids), rows)]
    model, acc, opt = trainer.model, trainer.accelerator, trainer.optimizer

    def step() -> dict:
        loss_sum = 0.0
        for inputs in micro:  # transformers Trainer.training_step, less _prepare_inputs
            with trainer.compute_loss_context_manager():
                loss = trainer.compute_loss(model, inputs, num_items_in_batch=inputs[
                    "num_items_in_batch"])
            acc.backward(loss)
            loss_sum += float(loss.detach())
        grad_norm = float(acc.clip_grad_norm_(model.parameters(), args.max_grad_norm))
        opt.step()
        model.zero_grad()
        return {"loss": loss_sum, "grad_norm": grad_norm, "tokens": trained}

    name = getattr(args.optim, "value", args.optim)
    return step, f"{type(opt).__name__} (optim={name}, fused={opt.defaults.get('fused')})"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--group", type=int, default=4)
    p.add_argument("--new-tokens", type=int, default=8)
    p.add_argument("--micro-groups", type=int, default=4, help="groups per forward/backward")
    p.add_argument("--steps", type=int, default=5, help="timed steps per side")
    p.add_argument("--warmup", type=int, default=1, help="untimed steps per side first")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--lr", type=float, default=1e-5)
    p.add_argument("--seed", type=int, default=0)
    resultfile.add_args(p)
    a = p.parse_args()
    if a.prompts % a.micro_groups:
        raise SystemExit(f"--prompts {a.prompts} must be a multiple of --micro-groups "
                         f"{a.micro_groups} (TRL accumulates whole micro-batches)")
    if min(a.prompts, a.group, a.new_tokens, a.steps, a.threads) < 1 or a.warmup < 0:
        raise SystemExit("--prompts, --group, --new-tokens, --steps, --threads must be >= 1 "
                         "and --warmup >= 0")
    for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):
        os.environ.setdefault(k, "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    rec = resultfile.start("trainer_throughput", a)
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    import transformers
    import trl

    from traingym.models.loader import load_policy

    base, tok = load_policy("embedded")  # fp32, the embedded folder (models/embedded.py)
    data = make_data(a, tok)
    work = Path(f"/tmp/trainer_throughput-{os.getpid()}")
    sides = {"traingym": traingym_side(a, copy.deepcopy(base), tok, data),
             "trl": trl_side(a, copy.deepcopy(base), tok, data, work)}
    del base
    times: dict[str, list[float]] = {k: [] for k in sides}
    first: dict[str, dict] = {}
    for n in range(a.warmup + a.steps):
        for name, (step, _) in sides.items():
            t0 = time.perf_counter()
            m = step()
            dt = time.perf_counter() - t0
            first.setdefault(name, m)
            kept = n >= a.warmup
            if kept:
                times[name].append(dt)
            print(f"{'step' if kept else 'warm-up'} {n} {name:8} {dt:6.2f} s  loss "
                  f"{m['loss']:+.6f}  grad_norm {m['grad_norm']:.6f}", flush=True)
    tokens = a.prompts * a.group * a.new_tokens
    assert all(first[k]["tokens"] == tokens for k in sides), first
    speed = {}
    for k, t in times.items():
        med = statistics.median(t)
        speed[k] = {"median_s": med, "tokens_per_s": tokens / med, "min_s": min(t),
                    "max_s": max(t), "all_s": t}
    ratio = speed["traingym"]["tokens_per_s"] / speed["trl"]["tokens_per_s"]
    for k, s in speed.items():
        print(f"{k:8} {s['median_s']:.3f} s/step  {s['tokens_per_s']:.1f} trained tokens/s")
    print(f"traingym / TRL tokens/s: {ratio:.2f}x  (target >= 1.5x)")
    print(f"first step: loss traingym {first['traingym']['loss']:+.6f} TRL "
          f"{first['trl']['loss']:+.6f}; grad_norm traingym {first['traingym']['grad_norm']:.6f} "
          f"TRL {first['trl']['grad_norm']:.6f}")
    flags = [f"--{k.replace('_', '-')} {v}" for k, v in vars(a).items()
             if k not in ("out", "label")]
    report = {
        "command": "python benchmarks/trainer_throughput.py " + " ".join(flags),
        "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "settings": {**vars(a), "prompt_tokens": len(data[0][0]),
                     "trained_tokens_per_step": tokens, "precision": "fp32",
                     "gradient_checkpointing": False, "loss": "token-level (GRPO / dapo)"},
        "optimizers": {k: v[1] for k, v in sides.items()},
        "machine": {"cpu": platform.processor() or platform.machine(),
                    "threads": a.threads},
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                     "trl": trl.__version__},
        "speed": speed, "ratio_traingym_over_trl_tokens_per_s": ratio, "target_ratio": 1.5,
        "first_step": first,
    }
    rec.write(report)


if __name__ == "__main__":
    main()
