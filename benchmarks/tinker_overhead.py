"""What the Tinker API costs: one RL step driven through `traingym tinker` against the same step
in `traingym train`, side by side, and the server's memory with one and with two LoRA clients.

(a) Step time. Side A: a `traingym train` run (subprocess; sync mode, colocated torch engine).
Side B: a `traingym tinker` server subprocess and a client (this file run as `--client` by the
client environment's interpreter, .venv-tinker's when it exists: the `tinker` SDK, no
traingym) that per step does what examples/tinker/rl_loop.py does: save_weights_and_get_
sampling_client, sample --batch-size prompts x --group-size completions, reward, advantages =
reward - group mean (groups of equal rewards dropped), one forward_backward
('importance_sampling' on the sampled tokens, their sampler log-probs as the behaviour
policy), one optim_step (AdamW); each phase timed on the client.

Equal on both sides: the model (--model); the task (traingym's `arith` rows, chat template +
prefill "The answer is"; B reads examples/tinker/arith.jsonl, the same train split); prompts x
group size; max new tokens; temperature 1; the reward (--reward ids, the default: a function
of the completion's token ids that only spreads a group, so a group trains unless all its
completions are the same tokens and both sides train on the whole batch; `digits`: traingym's
digit_fraction; `exact`: the first integer is the answer, where the dropped all-equal groups
make the two sides' work differ); LoRA (rank, alpha / rank, on q/k/v/o_proj and
gate/up/down_proj, no lm_head adapter: traingym's LoRA has none); fp32 throughout (no bf16
autocast, fp32 frozen base, fp32 sampling engine); AdamW (lr, betas 0.9 / 0.95, eps 1e-8, no
weight decay, no gradient clipping); torch threads (--threads: OMP_NUM_THREADS of the trainer
and of the server, and the run's `threads`); with --fixed-length (default) every completion is
exactly --max-tokens tokens (A: rollout.ignore_eos; B: stop = []). Each step records the
groups each side kept.

The loss: A runs algorithm `dr_grpo` with is_correction 'tis' and an unbounded cap. Its
gradient per completion token is -r A grad(logp) / (samples x max_new_tokens), r the ratio of
the trainer's to the engine's probability (detached; the PPO ratio is the trainer's own, 1 in
value, so the clip never binds): the server's importance_sampling gradient -r A grad(logp) up
to that constant divisor (which AdamW nearly ignores; not exactly, through eps). Both drop
groups whose rewards are all equal; A also drops samples with no completion tokens (none with
--fixed-length).

What differs is how each side does the work, which is what is measured: A's trainer runs a
group's prompt once and its completions against that prefix (trainer/logprobs.py); B's
forward_backward runs every datum's full row (prompt + completion; `forward_tokens` per step),
so B's forward and backward cover more tokens for the same batch. A sends only the adapters to
its engine (lora.sync 'adapter', --lora-sync), which merges them; B snapshots the adapters into
a new sampler and the engine merges them before sampling. B's calls cross HTTP (JSON and
protobuf) and its client builds the datums. A draws prompts in traingym's data order, B with
random.Random(seed) (same rows, other draws; prompt lengths are close). A is otherwise a
`traingym train` run as shipped: trace, events and samples logging on; evals off; its one
checkpoint (after the last step) is subtracted from that step.

Step seconds: A from the run's events.jsonl (the difference of `elapsed_s` between steps, so
everything the loop does per step, minus `seconds_checkpoint`; `seconds_step` is kept too), B
on the client around the whole step. Step 1 is warm-up on both; the figure is the median of
steps 2..N and the ratio B / A of those medians. --rounds 2 runs A, B, A, B.

(b) Memory: a fresh server; its RSS and peak RSS (VmRSS, VmHWM from /proc/<pid>/status) idle (no
model yet: the base loads with the first client), after a LoRA client is created, after it ran
one forward_backward + optim_step + save_weights_and_get_sampling_client + sample of the same
batch (the sampling engine's copy of the base loads with the first sample), and the same for a
second client on that base. Ratios: after client 2's step over after client 1's step.

The full run (the defaults) is estimated at 15-25 minutes on 2 quiet cores, extrapolated from
smoke runs on the embedded model (2 prompts x 2 x 4 tokens: about 4 s a step), not measured.

    .venv/bin/python benchmarks/tinker_overhead.py          # -> results/tinker_overhead/...
    .venv/bin/python benchmarks/tinker_overhead.py --model tiny --steps 2 --batch-size 2 \
        --group-size 2 --max-tokens 4 --out /tmp/tinker_overhead_smoke.json     # smoke
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

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
EXAMPLES = ROOT / "examples" / "tinker"
KEY_VAR = "TRAINGYM_BENCH_TINKER_KEY"
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
REWARD_FN = {"ids": "tinker_overhead:token_id_reward",
             "digits": "traingym.envs.tasks:digit_fraction",
             "exact": "traingym.envs.tasks:exact_answer"}


def ids_reward(ids) -> float:
    """A reward that only spreads a group: a function of the completion's token ids, so a group
    trains unless all its completions are the same tokens, on both sides alike (the work is
    what is measured here, not learning)."""
    return (sum(ids) % 997) / 997


def token_id_reward(sample) -> float:
    """`ids_reward` as a traingym reward (task.reward = 'tinker_overhead:token_id_reward')."""
    return ids_reward(sample.completion_ids)


def median_after_warmup(values: list[float]) -> float | None:
    return statistics.median(values[1:]) if len(values) > 1 else None


# -- side A: traingym train ------------------------------------------------------------------

def train_overrides(a) -> list[str]:
    sets = {
        "steps": a.steps, "seed": a.seed, "threads": a.threads,
        "model.path": a.model, "model.engine_dtype": "float32",
        "task.name": "arith", "task.reward": REWARD_FN[a.reward],
        "rollout.prompts_per_step": a.batch_size, "rollout.group_size": a.group_size,
        "rollout.max_new_tokens": a.max_tokens, "rollout.temperature": 1.0,
        "rollout.ignore_eos": json.dumps(a.fixed_length),
        "trainer.lr": a.learning_rate, "trainer.betas": "[0.9,0.95]",
        "trainer.weight_decay": 0.0, "trainer.grad_clip": 0.0,
        "trainer.bf16_autocast": "false",
        "trainer.micro_batch_groups": a.micro_batch_groups or a.batch_size,
        "lora.rank": a.lora_rank, "lora.alpha": a.lora_alpha,
        "lora.target_modules": json.dumps(LORA_TARGETS), "lora.sync": a.lora_sync,
        "lora.base_dtype": "float32",
        "algorithm.name": "dr_grpo", "algorithm.is_correction": "tis",
        "algorithm.is_cap": 1e30,
        "eval.before": "false", "eval.after": "false", "eval.num_prompts": 0,
    }
    return [x for k, v in sets.items() for x in ("--set", f"{k}={v}")]


def run_side_a(a, tmp: Path, label: str) -> dict:
    run_dir = tmp / f"train_{label}"
    cmd = [sys.executable, "-m", "traingym.cli", "train", "--quiet", "--run-dir",
           str(run_dir), *train_overrides(a)]
    env = {**os.environ, "OMP_NUM_THREADS": a.threads, "MKL_NUM_THREADS": a.threads,
           "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(HERE),
                                          os.environ.get("PYTHONPATH", "")])}
    t0 = time.time()
    out = subprocess.run(cmd, env=env, cwd=tmp, capture_output=True, text=True, check=False)
    wall = time.time() - t0
    if out.returncode != 0:
        raise SystemExit(f"traingym train exited {out.returncode}:\n{out.stderr[-4000:]}")
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()
              if line.strip()]
    steps = [e for e in events if "seconds_step" in e]
    rows, prev = [], 0.0
    for e in steps:
        rows.append({"step": e["step"], "seconds": e["elapsed_s"] - prev - e["seconds_checkpoint"],
                     "seconds_step": e["seconds_step"] - e["seconds_checkpoint"],
                     **{k: e[k] for k in ("seconds_rollout", "seconds_train", "seconds_sync",
                                          "seconds_checkpoint", "sync_encode_s", "sync_apply_s",
                                          "sync_engine_s", "groups_kept", "trained_tokens",
                                          "gen_tokens", "reward_mean") if k in e}})
        prev = e["elapsed_s"]
    keys = ("seconds", "seconds_step", "seconds_rollout", "seconds_train", "seconds_sync")
    return {"command": cmd, "wall_s": wall, "steps": rows,
            "median_s": {k: median_after_warmup([r[k] for r in rows]) for k in keys}}


# -- side B: the server and the client ---------------------------------------------------------

def start_server(a, tmp: Path, key: str, name: str) -> tuple[subprocess.Popen, str, Path, list]:
    sys.path.insert(0, str(HERE))
    from tinker_rl import free_port, wait_healthy  # benchmarks/tinker_rl.py

    config = tmp / f"{name}.json"
    config.write_text(json.dumps({"tinker": {"models": [a.model], "runs_dir": str(tmp / name),
                                             "lora_alpha": a.lora_alpha}}))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, KEY_VAR: key, "OMP_NUM_THREADS": a.threads,
           "MKL_NUM_THREADS": a.threads,
           "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    log = tmp / f"{name}.log"
    cmd = [sys.executable, "-m", "traingym.cli", "tinker", str(config), "--port", str(port),
           "--api-key-env", KEY_VAR]
    with log.open("w") as out:
        server = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        wait_healthy(url, server, log)
    except BaseException:
        server.terminate()
        server.wait(30)
        raise
    return server, url, log, cmd


def run_client(a, client: str, url: str, key: str, mode: str, tmp: Path, label: str,
               server_pid: int, log: Path) -> dict:
    out_path = tmp / f"client_{label}.json"
    args = {"mode": mode, "base_url": url, "model": a.model, "steps": a.steps,
            "batch_size": a.batch_size, "group_size": a.group_size, "max_tokens": a.max_tokens,
            "fixed_length": a.fixed_length, "learning_rate": a.learning_rate,
            "lora_rank": a.lora_rank, "reward": a.reward, "seed": a.seed,
            "server_pid": server_pid, "out": str(out_path)}
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(TINKER_API_KEY=key, OMP_NUM_THREADS="1")
    cmd = [client, str(Path(__file__).resolve()), "--client", json.dumps(args)]
    run = subprocess.run(cmd, env=env, cwd=tmp, check=False)
    if run.returncode != 0:
        raise SystemExit(f"the client exited {run.returncode}; server log:\n"
                         f"{log.read_text()[-4000:]}")
    return {"command": cmd, **json.loads(out_path.read_text())}


def run_side_b(a, tmp: Path, client: str, label: str) -> dict:
    key = "tml-bench-" + os.urandom(12).hex()
    server, url, log, cmd = start_server(a, tmp, key, f"server_{label}")
    try:
        res = run_client(a, client, url, key, "steps", tmp, label, server.pid, log)
    finally:
        server.terminate()
        server.wait(30)
    rows = res["steps"]
    keys = ("seconds", "snapshot_s", "sample_s", "reward_datums_s", "forward_backward_s",
            "optim_step_s")
    return {"server_command": cmd, **res,
            "median_s": {k: median_after_warmup([r[k] for r in rows]) for k in keys}}


def run_memory(a, tmp: Path, client: str) -> dict:
    key = "tml-bench-" + os.urandom(12).hex()
    server, url, log, cmd = start_server(a, tmp, key, "server_memory")
    try:
        res = run_client(a, client, url, key, "memory", tmp, "memory", server.pid, log)
    finally:
        server.terminate()
        server.wait(30)
    phases = res["phases"]
    one, two = phases["client1_after_step"], phases["client2_after_step"]
    return {"server_command": cmd, **res,
            "ratio_rss_2_over_1": two["VmRSS_kib"] / one["VmRSS_kib"],
            "ratio_peak_2_over_1": two["VmHWM_kib"] / one["VmHWM_kib"]}


# -- the client (runs in the client environment: the tinker SDK, torch, no traingym) ------------

def proc_status(pid: int) -> dict:
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        k, _, v = line.partition(":")
        if k in ("VmRSS", "VmHWM"):
            out[f"{k}_kib"] = int(v.split()[0])
    return out


def client_main(args: dict) -> None:
    import random

    import tinker
    import torch
    from tinker import types
    from tinker.types.tensor_data import TensorData

    sys.path.insert(0, str(EXAMPLES))
    from rl_loop import REWARDS, load_rows, prompt_input  # examples/tinker/rl_loop.py

    text_reward = REWARDS.get(args["reward"])
    train_rows = load_rows(EXAMPLES / "arith.jsonl")["train"]
    rng = random.Random(args["seed"])
    service = tinker.ServiceClient(base_url=args["base_url"])
    adam = types.AdamParams(learning_rate=args["learning_rate"], beta1=0.9, beta2=0.95, eps=1e-8,
                            weight_decay=0.0, grad_clip_norm=0.0)

    def new_client():
        tc = service.create_lora_training_client(base_model=args["model"],
                                                 rank=args["lora_rank"], seed=args["seed"],
                                                 train_unembed=False)
        return tc if not hasattr(tc, "result") else tc.result()

    def step(tc, tokenizer, params) -> dict:
        t0 = time.perf_counter()
        sampler = tc.save_weights_and_get_sampling_client().result()
        t1 = time.perf_counter()
        batch = rng.sample(train_rows, min(args["batch_size"], len(train_rows)))
        prompts = [prompt_input(tokenizer, r["prompt"]) for r in batch]
        futures = [sampler.sample(prompt=p, num_samples=args["group_size"],
                                  sampling_params=params) for p in prompts]
        results = [f.result().sequences for f in futures]
        t2 = time.perf_counter()
        datums, kept, tokens, rows = [], 0, 0, 0
        for seqs, prompt, row in zip(results, prompts, batch):
            rewards = [ids_reward(s.tokens) if text_reward is None else
                       text_reward(tokenizer.decode(s.tokens), row["answer"]) for s in seqs]
            mean = sum(rewards) / len(rewards)
            advantages = [r - mean for r in rewards]
            if all(adv == 0.0 for adv in advantages):
                continue  # no signal in this group (traingym drops it too)
            kept += 1
            for seq, adv in zip(seqs, advantages):
                toks, lps = list(seq.tokens), list(seq.logprobs)
                tokens += len(toks)
                ob = prompt.length - 1
                model_input = prompt.append(types.EncodedTextChunk(tokens=toks[:-1]))
                rows += model_input.length
                datums.append(types.Datum(model_input=model_input, loss_fn_inputs={
                    "target_tokens": TensorData.from_torch(torch.tensor([0] * ob + toks)),
                    "logprobs": TensorData.from_torch(torch.tensor([0.0] * ob + lps)),
                    "advantages": TensorData.from_torch(torch.tensor(
                        [0.0] * ob + [adv] * (model_input.length - ob))),
                }))
        t3 = time.perf_counter()
        t4 = t5 = t3
        if datums:
            fb = tc.forward_backward(datums, loss_fn="importance_sampling")
            opt = tc.optim_step(adam)  # queued behind it, as rl_loop.py does
            fb.result()
            t4 = time.perf_counter()
            opt.result()
            t5 = time.perf_counter()
        return {"seconds": t5 - t0, "snapshot_s": t1 - t0, "sample_s": t2 - t1,
                "reward_datums_s": t3 - t2, "forward_backward_s": t4 - t3,
                "optim_step_s": t5 - t4, "groups_kept": kept, "datums": len(datums),
                "completion_tokens": tokens, "forward_tokens": rows}

    def params_for(tokenizer):
        stop = [] if args["fixed_length"] else (
            [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else None)
        return types.SamplingParams(max_tokens=args["max_tokens"], temperature=1.0, stop=stop)

    out: dict = {}
    if args["mode"] == "steps":
        tc = new_client()
        tokenizer = tc.get_tokenizer()
        params = params_for(tokenizer)
        out["steps"] = []
        for i in range(args["steps"]):
            row = {"step": i + 1, **step(tc, tokenizer, params)}
            out["steps"].append(row)
            print(json.dumps(row), flush=True)
    else:
        pid = args["server_pid"]
        phases = {"idle": proc_status(pid)}
        for n in (1, 2):
            tc = new_client()
            tokenizer = tc.get_tokenizer()
            phases[f"client{n}_created"] = proc_status(pid)
            phases[f"client{n}_step"] = step(tc, tokenizer, params_for(tokenizer))
            phases[f"client{n}_after_step"] = proc_status(pid)
            print(json.dumps({k: v for k, v in phases.items() if k.startswith(f"client{n}")}),
                  flush=True)
        out["phases"] = phases
    Path(args["out"]).write_text(json.dumps(out, indent=1))
    service.close("success").result()  # the session ends before the interpreter exits


# -- main ------------------------------------------------------------------------------------

def main() -> int:
    if len(sys.argv) == 3 and sys.argv[1] == "--client":
        client_main(json.loads(sys.argv[2]))
        return 0
    import resultfile
    from tinker_rl import client_interpreter, client_versions

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="embedded", help="'embedded' (SmolLM2-135M) or 'tiny'")
    p.add_argument("--steps", type=int, default=8, help="steps per side (step 1 is warm-up)")
    p.add_argument("--rounds", type=int, default=1, help="A then B, this many times")
    p.add_argument("--batch-size", type=int, default=8, help="prompts per step")
    p.add_argument("--group-size", type=int, default=8, help="completions per prompt")
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--fixed-length", action=argparse.BooleanOptionalAction, default=True,
                   help="every completion is --max-tokens long (no stop at EOS), on both sides")
    p.add_argument("--reward", choices=sorted(REWARD_FN), default="ids",
                   help="ids: a function of the token ids (every group trains on both sides); "
                   "digits: traingym's digit_fraction; exact: the first integer is the answer")
    p.add_argument("--learning-rate", type=float, default=4e-4)
    p.add_argument("--lora-rank", type=int, default=32)
    p.add_argument("--lora-alpha", type=float, default=32.0,
                   help="both sides (the server's lora_alpha; the run's lora.alpha)")
    p.add_argument("--lora-sync", choices=("adapter", "merged"), default="adapter",
                   help="A's lora.sync ('adapter' sends the adapters, which the engine merges, "
                   "as the server merges a snapshot's; 'merged' is traingym's default)")
    p.add_argument("--micro-batch-groups", type=int, default=0,
                   help="A's groups per forward/backward pass (0: the whole batch in one, as "
                   "the server runs a request under its pass_tokens)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", default="1", help="torch threads of the trainer and of the "
                   "server, both sides (OMP_NUM_THREADS; the run's `threads`). 1 as in "
                   "benchmarks/tinker_rl.py, where on the shared 2-core machine it sampled "
                   "4-8x faster than torch's default under load")
    p.add_argument("--skip-memory", action="store_true", help="only part (a)")
    p.add_argument("--client-python", default=None,
                   help="interpreter of the client (default .venv-tinker's, else this)")
    resultfile.add_args(p)
    a = p.parse_args()
    rec = resultfile.start("tinker_overhead", a)
    client = client_interpreter(a.client_python)
    rounds = []
    with tempfile.TemporaryDirectory(prefix="tinker_overhead_") as tmp:
        tmp = Path(tmp)
        for r in range(a.rounds):
            side_a = run_side_a(a, tmp, f"r{r}")
            print(json.dumps({"round": r, "A_median_s": side_a["median_s"]}), flush=True)
            side_b = run_side_b(a, tmp, client, f"r{r}")
            print(json.dumps({"round": r, "B_median_s": side_b["median_s"]}), flush=True)
            rounds.append({"A": side_a, "B": side_b})
        memory = None if a.skip_memory else run_memory(a, tmp, client)
    a_steps = [s["seconds"] for rd in rounds for s in rd["A"]["steps"][1:]]
    b_steps = [s["seconds"] for rd in rounds for s in rd["B"]["steps"][1:]]
    med_a = statistics.median(a_steps) if a_steps else None
    med_b = statistics.median(b_steps) if b_steps else None
    result = {
        "model": a.model, "settings": {k: v for k, v in vars(a).items()
                                       if k not in ("out", "label")},
        "equal_on_both_sides": "see the module docstring (benchmarks/tinker_overhead.py)",
        "lora_targets": LORA_TARGETS, "train_algorithm": "dr_grpo, is_correction tis, "
        "is_cap 1e30", "server_loss": "importance_sampling",
        "client_python": client, "client_versions": client_versions(client),
        "step_s_median": {"A_traingym_train": med_a, "B_tinker_api": med_b},
        "ratio_B_over_A": med_b / med_a if med_a and med_b else None,
        "target_ratio_max": 1.3,
        "rounds": rounds,
        "B_split_median_s": {k: statistics.median(
            [s[k] for rd in rounds for s in rd["B"]["steps"][1:]]) if b_steps else None
            for k in ("snapshot_s", "sample_s", "reward_datums_s", "forward_backward_s",
                      "optim_step_s")},
        "A_split_median_s": {k: statistics.median(
            [s[k] for rd in rounds for s in rd["A"]["steps"][1:]]) if a_steps else None
            for k in ("seconds_rollout", "seconds_train", "seconds_sync")},
        "memory": memory, "memory_target_ratio_max": 1.2,
    }
    print(json.dumps({k: result[k] for k in ("step_s_median", "ratio_B_over_A",
                                             "B_split_median_s", "A_split_median_s")}, indent=1))
    if memory:
        print(json.dumps({k: memory[k] for k in ("phases", "ratio_rss_2_over_1",
                                                 "ratio_peak_2_over_1")}, indent=1))
    rec.write(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
