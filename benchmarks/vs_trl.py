"""traingym against TRL's GRPOTrainer on CPU: seconds per RL step and held-out reward.

    python benchmarks/vs_trl.py                  # 20 steps each, about 10-15 minutes on 2 cores
        # -> benchmarks/results/vs_trl/<date>-<commit>.json (benchmarks/resultfile.py)
    python benchmarks/vs_trl.py --steps 2 --out /tmp/vs_trl_smoke.json        # smoke run
    python benchmarks/vs_trl.py --no-drop        # equal work: traingym trains every group
        # -> benchmarks/results/vs_trl/<date>-<commit>-no_drop.json

Equal on both sides: the embedded SmolLM2-135M-Instruct (same safetensors folder), the built-in
`arith` task (same train rows; the same 128 held-out rows), identical prompt token ids (the chat
template plus the pre-fill "The answer is", rendered by traingym's PromptRenderer and handed to
TRL as plain text, which TRL tokenizes without re-applying a template; checked below), the
exact-answer reward (first integer equals the answer), 16 prompts x 4 completions per step,
temperature 1.0, exactly 8 new tokens per completion, one AdamW step per 64 completions at a
constant lr 1e-5 (betas 0.9/0.99, no weight decay, grad-norm clip 1.0), all 64 completions in
one forward/backward pass (TRL: per_device_train_batch_size 64, no gradient accumulation;
traingym: trainer.micro_batch_groups 16, since 12-06: before, traingym ran 4 passes of 4
groups, its default), freed memory kept for reuse between phases, as TRL's plain torch loop
keeps it (traingym: trainer.trim_memory false, since 12-06; its default gives the heap's free
pages back after each rollout, pass and step, for a lower peak: benchmarks/page_faults.py
measures that cost), PPO clip 0.2/0.28,
token-level loss averaging, no std-scaling of advantages, no KL, bf16 autocast over fp32
master weights, 2 torch threads, the same number of steps. A step is generation + reward +
training + weight sync (traingym: rollout + train + sync from its events.jsonl, checkpoint
time excluded; TRL: on_step_begin to on_step_end, logging excluded). Each framework trains in
its own subprocess, one after the other; then one evaluator scores the base and both trained
models on the held-out rows (traingym's TorchEngine in bf16 and traingym.evaluate: greedy, and
4 samples per prompt at T=1, 8 new tokens, stop at end of turn; standard errors over prompts).

Not equal, because the frameworks differ inside: traingym samples from a separate bf16 copy
of the weights with a prefix-shared KV cache and trains with the prompt run once per group;
TRL samples with HF `generate` from the training model and trains on full sequences. traingym
puts torch's tensors of 2 MiB and more on transparent huge pages (its `huge_pages` default,
since 12-06); TRL runs on torch's default pages unless --trl-huge-pages gives its process the
same setting (result file name ending -trl_huge_pages). traingym
drops groups whose 4 rewards are all equal (no gradient, but fewer tokens trained); TRL trains
on them with zero advantage. Fixed length: traingym keeps sampling past an end-of-turn token
(rollout.ignore_eos); TRL cannot, so it forbids that token for 8 tokens (min_new_tokens=8) and
its completions never contain it. TRL's gradient checkpointing (its default) is turned off,
since traingym does not recompute activations. Data order and sampling noise differ (the
same seed drives different code), so one run of each is one draw: the reward comparison is
as good as its standard errors, not better.

`--no-drop` gives the equal-work comparison: traingym runs GRPOAllGroups (below: GRPO with
`drop_equal_groups = False`, picked by its 'vs_trl:GRPOAllGroups' path as algorithm.name, which
the registry accepts), so a group whose rewards are all equal is trained with zero advantage as
TRL trains it, and the loss is divided by all the batch's tokens, as TRL's "dapo" loss divides
it: both sides then run forward and backward over every completion, and the s/step ratio does
not depend on dropping. Its result file's name ends in -no_drop unless --label or --out say
otherwise (the first: benchmarks/results/vs_trl/2026-12-04-d495110-no_drop.json, beside the
default run's 2026-12-02-af0266e.json). Zero-advantage tokens add nothing to the gradient; only
the divisor grows (a smaller gradient before clipping and AdamW's scaling), so the update
differs from the default run's and the held-out reward is a separate draw.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import resultfile

from traingym.algorithms.grpo import GRPO

PREFILL = "The answer is"
PROMPTS, GROUP, NEW_TOKENS, TEMP, LR, HELDOUT = 16, 4, 8, 1.0, 1e-5, 128


class GRPOAllGroups(GRPO):
    """GRPO that trains every group (--no-drop): all-equal groups carry zero advantage but
    still cost a forward and backward pass and count in the loss divisor, as in TRL."""

    drop_equal_groups = False


def peak_rss_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def traingym_overrides(a) -> dict:
    """traingym's side of the comparison, as config overrides (benchmarks/page_faults.py runs
    the same)."""
    return {
        "seed": a.seed, "steps": a.steps, "threads": a.threads,
        "model": {"path": "embedded", "engine_dtype": "bfloat16"},
        "task": {"name": "arith", "prefill": PREFILL},
        "rollout": {"prompts_per_step": PROMPTS, "group_size": GROUP, "temperature": TEMP,
                    "max_new_tokens": NEW_TOKENS, "ignore_eos": True},
        "trainer": {"lr": LR, "betas": [0.9, 0.99], "weight_decay": 0.0, "grad_clip": 1.0,
                    "bf16_autocast": True, "micro_batch_groups": PROMPTS,
                    "trim_memory": False},
        "algorithm": {"name": "vs_trl:GRPOAllGroups" if a.no_drop else "grpo",
                      "clip_low": 0.2, "clip_high": 0.28, "kl_coef": 0.0,
                      "normalize_std": False},
        "eval": {"num_prompts": HELDOUT, "before": False, "after": False}}


def run_traingym(a, work: Path) -> dict:
    import traingym
    from traingym.config.load import build_config

    cfg = build_config(overrides=traingym_overrides(a))
    t0 = time.monotonic()
    res = traingym.train(cfg, run_dir=work / "traingym", progress=False)
    wall = time.monotonic() - t0
    ev = [json.loads(line) for line in (res.run_dir / "events.jsonl").read_text().splitlines()]
    ckpt = sorted((res.run_dir / "checkpoints").glob("step_*"))[-1] / "model.safetensors"
    return {"step_s": [e["seconds_rollout"] + e["seconds_train"] + e["seconds_sync"] for e in ev],
            "rollout_s": [e["seconds_rollout"] for e in ev],
            "train_s": [e["seconds_train"] for e in ev],
            "sync_s": [e["seconds_sync"] for e in ev],
            "sync_encode_s": [e.get("sync_encode_s") for e in ev],
            "train_reward": [e["reward_mean"] for e in ev],
            "completion_len": [e["completion_len_mean"] for e in ev],
            "groups_kept": [e["groups_kept"] for e in ev],
            "wall_s": wall, "peak_rss_gb": peak_rss_gb(), "weights": str(ckpt)}


def run_trl(a, work: Path) -> dict:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from traingym.envs.render import PromptRenderer
    from traingym.envs.tasks import builtin_task, first_integer
    from traingym.models.embedded import embedded_model_dir

    torch.set_num_threads(a.threads)
    folder = embedded_model_dir()
    tok = AutoTokenizer.from_pretrained(folder)
    renderer = PromptRenderer(tok, PREFILL)
    rows = builtin_task("arith", num_heldout=HELDOUT).train
    for r in rows[:8]:  # TRL tokenizes plain-text prompts with tok(text=...): same ids?
        assert tuple(tok(text=[renderer.text(r)])["input_ids"][0]) == renderer.ids(r)
    data = Dataset.from_list([{"prompt": renderer.text(r), "answer": r["answer"]} for r in rows])

    def exact_answer(completions, answer, **_):
        return [1.0 if first_integer(c) == int(x) else 0.0 for c, x in zip(completions, answer)]

    times: list[float] = []

    class StepTimer(TrainerCallback):
        def on_step_begin(self, *args, **kw):
            self.t0 = time.monotonic()

        def on_step_end(self, *args, **kw):
            times.append(time.monotonic() - self.t0)

    args = GRPOConfig(
        output_dir=str(work / "trl"), max_steps=a.steps, seed=a.seed, use_cpu=True,
        per_device_train_batch_size=PROMPTS * GROUP, gradient_accumulation_steps=1,
        num_generations=GROUP, num_iterations=1, max_completion_length=NEW_TOKENS,
        generation_kwargs={"min_new_tokens": NEW_TOKENS}, temperature=TEMP, top_p=1.0, top_k=0,
        learning_rate=LR, lr_scheduler_type="constant", warmup_steps=0, adam_beta1=0.9,
        adam_beta2=0.99, weight_decay=0.0, max_grad_norm=1.0, beta=0.0, epsilon=0.2,
        epsilon_high=0.28, loss_type="dapo", scale_rewards="none", bf16=True,
        gradient_checkpointing=False, report_to="none", save_strategy="no", logging_steps=1,
        disable_tqdm=True, dataloader_num_workers=0, log_completions=False)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    trainer = GRPOTrainer(model=model, reward_funcs=exact_answer, args=args, train_dataset=data,
                          processing_class=tok, callbacks=[StepTimer()])
    t0 = time.monotonic()
    trainer.train()
    wall = time.monotonic() - t0
    logs = [h for h in trainer.state.log_history if "reward" in h]
    out = work / "trl_model"
    trainer.model.save_pretrained(out)
    return {"step_s": times, "train_reward": [h["reward"] for h in logs],
            "completion_len": [h.get("completions/mean_length") for h in logs],
            "wall_s": wall, "peak_rss_gb": peak_rss_gb(), "weights": str(out / "model.safetensors")}


def run_eval(a, work: Path) -> dict:
    import copy

    import torch
    from safetensors.torch import load_model

    from traingym.envs.render import PromptRenderer
    from traingym.envs.single_turn import SingleTurnFactory
    from traingym.envs.tasks import builtin_task, exact_answer
    from traingym.envs.evaluate import evaluate, paired_difference
    from traingym.models.loader import load_policy
    from traingym.rollout.torch_engine import TorchEngine

    torch.set_num_threads(a.threads)
    base, tok = load_policy("embedded")
    rows = builtin_task("arith", num_heldout=HELDOUT).heldout
    factory = SingleTurnFactory(exact_answer, PromptRenderer(tok, PREFILL))
    trained = {k: json.loads((work / f"{k}.json").read_text())["weights"]
               for k in ("traingym", "trl")}
    scores = {}
    for name, weights in [("base", None), *trained.items()]:
        model = copy.deepcopy(base)
        if weights:
            missing, unexpected = load_model(model, weights, strict=False)
            assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)
        engine = TorchEngine(model, tok.pad_token_id, 64, torch.bfloat16)
        scores[name] = evaluate(engine, factory, rows, TEMP, 4, NEW_TOKENS,
                                (tok.eos_token_id,), seed=a.seed + 7, tokenizer=tok)
    out = {k: {m: s.summary() for m, s in v.items()} for k, v in scores.items()}
    out["traingym_minus_trl"] = {m: paired_difference(scores["traingym"][m], scores["trl"][m])
                                 for m in ("greedy", "sampled")}
    return out


def summarise(times: list[float], skip: int) -> dict:
    kept = times[skip:] if len(times) > skip else times
    return {"median_s": statistics.median(kept), "mean_s": statistics.fmean(kept),
            "min_s": min(kept), "max_s": max(kept), "total_s": sum(times),
            "skipped_first": len(times) - len(kept), "steps": len(times)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--skip", type=int, default=2, help="first steps left out of the median")
    p.add_argument("--no-drop", action="store_true",
                   help="equal work: traingym trains every group, none dropped (GRPOAllGroups)")
    p.add_argument("--trl-huge-pages", action="store_true",
                   help="TRL's process too puts torch's tensors of 2 MiB and more on huge pages "
                        "(THP_MEM_ALLOC_ENABLE=1, as traingym's huge_pages does for its own)")
    resultfile.add_args(p)
    p.add_argument("--work", default=None,
                   help="scratch folder, kept (default: a temporary folder, removed at the end: "
                        "it holds two trained models and traingym's checkpoints, ~2 GB)")
    p.add_argument("--worker", choices=["traingym", "trl", "eval"], help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.worker:
        work = Path(a.work)
        fn = {"traingym": run_traingym, "trl": run_trl, "eval": run_eval}[a.worker]
        (work / f"{a.worker}.json").write_text(json.dumps(fn(a, work), indent=1))
        return
    a.label = a.label or ("-".join(x for x, on in (("no_drop", a.no_drop),
                                                   ("trl_huge_pages", a.trl_huge_pages)) if on)
                          or None)
    rec = resultfile.start("vs_trl", a)
    if a.work:
        work = Path(a.work)
        work.mkdir(parents=True, exist_ok=False)
        compare(a, rec, work)
    else:
        with tempfile.TemporaryDirectory(prefix="vs_trl-") as tmp:
            compare(a, rec, Path(tmp))


def compare(a: argparse.Namespace, rec, work: Path) -> None:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "HF_DATASETS_OFFLINE": "1", "OMP_NUM_THREADS": str(a.threads),
           "TOKENIZERS_PARALLELISM": "false"}
    results, proc_wall, load = {}, {}, {}
    for worker in ("traingym", "trl", "eval"):
        print(f"== {worker} ... (load average {os.getloadavg()[0]:.2f})", flush=True)
        t0, load[worker] = time.monotonic(), [os.getloadavg()[0]]
        thp = {"THP_MEM_ALLOC_ENABLE": "1"} if worker == "trl" and a.trl_huge_pages else {}
        subprocess.run([sys.executable, __file__, "--worker", worker, "--work", str(work),
                        "--steps", str(a.steps), "--threads", str(a.threads),
                        "--seed", str(a.seed), *(["--no-drop"] if a.no_drop else [])],
                       env={**env, **thp}, check=True)
        proc_wall[worker] = time.monotonic() - t0
        load[worker].append(os.getloadavg()[0])  # other users' jobs share the 2 cores
        results[worker] = json.loads((work / f"{worker}.json").read_text())
    ev = results.pop("eval")
    speed = {k: summarise(results[k]["step_s"], a.skip) for k in ("traingym", "trl")}
    ratio = speed["trl"]["median_s"] / speed["traingym"]["median_s"]
    print(f"\n{'':10} {'s/step med':>10} {'total s':>8} {'proc s':>7} {'RSS GB':>6} "
          f"{'greedy':>13} {'sampled T=1':>13}")
    for k in ("base", "traingym", "trl"):
        s, r = speed.get(k), results.get(k, {})
        cols = (f"{s['median_s']:10.2f} {s['total_s']:8.1f} {proc_wall[k]:7.1f} "
                f"{r['peak_rss_gb']:6.2f}") if s else f"{'-':>10} {'-':>8} {'-':>7} {'-':>6}"
        g, sm = ev[k]["greedy"], ev[k]["sampled"]
        print(f"{k:10} {cols} {g['mean']:6.3f}±{g['se']:.3f} {sm['mean']:6.3f}±{sm['se']:.3f}")
    d = ev["traingym_minus_trl"]
    print(f"\nTRL s/step / traingym s/step (median): {ratio:.2f}x")
    print("traingym - TRL held-out reward (paired over prompts): " + "  ".join(
        f"{m} {v['delta']:+.3f} ± {v['se']:.3f}" for m, v in d.items()))
    import torch
    import transformers
    import trl

    report = {"date": time.strftime("%Y-%m-%d"), "steps": a.steps, "threads": a.threads,
              "no_drop": a.no_drop, "trl_huge_pages": a.trl_huge_pages,
              "traingym_algorithm": ("GRPOAllGroups (every group trained)" if a.no_drop
                                     else "grpo"),
              "seed": a.seed, "settings": {"prompts_per_step": PROMPTS, "group_size": GROUP,
                                           "new_tokens": NEW_TOKENS, "temperature": TEMP,
                                           "lr": LR, "heldout_prompts": HELDOUT},
              "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                           "trl": trl.__version__},
              "speed": speed, "ratio_trl_over_traingym": ratio, "process_wall_s": proc_wall,
              "loadavg_1min_before_after": load,
              "eval": ev, "per_step": results, "work_dir": str(work) if a.work else None}
    rec.write(report)


if __name__ == "__main__":
    main()
