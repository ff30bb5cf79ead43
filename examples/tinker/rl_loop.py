"""RL on traingym's arithmetic task through the Tinker API: the shape of the tinker-cookbook's
recipes/rl_loop.py, written against the `tinker` SDK alone (no traingym, no cookbook), so it
runs against any Tinker server: `traingym tinker` or another.

    traingym tinker --api-key-env TINKER_API_KEY &            # serves 'tiny' and 'embedded'
    python examples/tinker/rl_loop.py --base-url http://127.0.0.1:8100 --model embedded

Each step: snapshot the weights into a sampling client (save_weights_and_get_sampling_client),
sample a group of completions per prompt, reward 1.0 when the completion's first integer is the
answer (`--reward exact`; `--reward digits`, a format reward, gives smoke runs on the untrained
'tiny' model a signal), advantages = reward - group mean (groups with equal rewards are
dropped), one forward_backward with the `importance_sampling` loss on the sampled tokens
(their sampler log-probs as the behaviour policy), one AdamW optim_step. Held-out prompts are
sampled before and after training (reward mean and its standard error over prompts).

Where it departs from the cookbook's rl_loop: the dataset is a local JSONL (its rl_loop loads
openai/gsm8k from the hub), the prompt is the model's own chat template plus the prefill "The
answer is" (as traingym's `arith` task renders it; the cookbook uses its renderers and a
few-shot prefix), no checkpoints or resume. arith.jsonl (beside this file) holds traingym's
`arith` rows, train and held-out as traingym splits them, written with:
    builtin_task("arith") -> {"prompt", "answer", "split": "train" | "heldout"} per line
(traingym.envs.tasks). The API key comes from $TINKER_API_KEY, as the SDK reads it.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import re
import time
from pathlib import Path

import tinker
import torch
from tinker import types
from tinker.types.tensor_data import TensorData

HERE = Path(__file__).resolve().parent
PREFILL = "The answer is"
_INT = re.compile(r"-?\d+")


def exact(text: str, answer: int) -> float:
    """1.0 when the first integer in the completion is the answer (traingym's exact_answer)."""
    m = _INT.search(text)
    return 1.0 if m is not None and int(m.group()) == answer else 0.0


def digits(text: str, answer: int) -> float:
    """The fraction of digit characters (traingym's digit_fraction): format, not correctness;
    it has signal for an untrained model such as 'tiny', for smoke runs."""
    return sum(c.isdigit() for c in text) / len(text) if text else 0.0


REWARDS = {"exact": exact, "digits": digits}


def load_rows(path: Path) -> dict[str, list[dict]]:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return {split: [r for r in rows if r["split"] == split] for split in ("train", "heldout")}


def prompt_input(tokenizer, question: str) -> types.ModelInput:
    text = tokenizer.apply_chat_template([{"role": "user", "content": question}],
                                         tokenize=False, add_generation_prompt=True) + PREFILL
    return types.ModelInput.from_ints(tokenizer.encode(text, add_special_tokens=False))


def evaluate(sampling_client, tokenizer, rows, params, samples: int, reward) -> dict:
    """Mean reward over rows (each the mean of `samples` completions) and its standard error."""
    futures = [sampling_client.sample(prompt=prompt_input(tokenizer, r["prompt"]),
                                      num_samples=samples, sampling_params=params) for r in rows]
    per_prompt_P = []
    for future, row in zip(futures, rows):
        seqs = future.result().sequences
        per_prompt_P.append(sum(reward(tokenizer.decode(s.tokens), row["answer"])
                                for s in seqs) / len(seqs))
    n = len(per_prompt_P)
    mean = sum(per_prompt_P) / n
    var = sum((x - mean) ** 2 for x in per_prompt_P) / (n - 1) if n > 1 else 0.0
    return {"reward_mean": mean, "reward_se": math.sqrt(var / n), "n": n,
            "samples_per_prompt": samples, "per_prompt": per_prompt_P}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--base-url", default=None, help="the Tinker server (default: the SDK's)")
    p.add_argument("--model", default="embedded", help="base model the server serves")
    p.add_argument("--data", default=str(HERE / "arith.jsonl"))
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--batch-size", type=int, default=16, help="prompts per step")
    p.add_argument("--group-size", type=int, default=8, help="completions per prompt")
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--learning-rate", type=float, default=4e-4, help="AdamW's; LoRA adapters "
                   "need a larger one than full fine-tuning")
    p.add_argument("--lora-rank", type=int, default=32)
    p.add_argument("--eval-prompts", type=int, default=128, help="held-out prompts (0: none)")
    p.add_argument("--eval-samples", type=int, default=4, help="completions per held-out prompt")
    p.add_argument("--reward", choices=sorted(REWARDS), default="exact")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="write the per-step metrics and evals as JSON")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    a = parse_args(argv)
    # Closing the client ends the session on the server (its clients' memory is freed) and
    # stops the SDK's background requests before the interpreter exits.
    with tinker.ServiceClient(base_url=a.base_url) as service_client:
        return train(service_client, a)


def train(service_client, a: argparse.Namespace) -> dict:
    reward = REWARDS[a.reward]
    rows = load_rows(Path(a.data))
    train_rows, heldout = rows["train"], rows["heldout"][:a.eval_prompts]
    rng = random.Random(a.seed)
    training_client = service_client.create_lora_training_client(
        base_model=a.model, rank=a.lora_rank).result()
    tokenizer = training_client.get_tokenizer()
    stop = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else None
    sampling_params = types.SamplingParams(max_tokens=a.max_tokens, temperature=a.temperature,
                                           stop=stop)
    eval_params = types.SamplingParams(max_tokens=a.max_tokens, temperature=a.temperature,
                                       stop=stop, seed=a.seed)
    adam_params = types.AdamParams(learning_rate=a.learning_rate, beta1=0.9, beta2=0.95,
                                   eps=1e-8)
    result: dict = {"config": vars(a), "steps": [], "eval": {}}

    sampling_client = training_client.save_weights_and_get_sampling_client().result()
    if heldout:
        result["eval"]["before"] = evaluate(sampling_client, tokenizer, heldout, eval_params,
                                            a.eval_samples, reward)
        print(f"held-out reward before: {result['eval']['before']}", flush=True)
    for step in range(a.steps):
        t0 = time.time()
        if step > 0:
            sampling_client = training_client.save_weights_and_get_sampling_client().result()
        batch = rng.sample(train_rows, min(a.batch_size, len(train_rows)))
        prompts_P = [prompt_input(tokenizer, r["prompt"]) for r in batch]
        futures_P = [sampling_client.sample(prompt=prompt, num_samples=a.group_size,
                                            sampling_params=sampling_params)
                     for prompt in prompts_P]
        datums_D: list[types.Datum] = []
        rewards_P: list[float] = []
        for future, prompt, row in zip(futures_P, prompts_P, batch):
            sequences_G = future.result().sequences
            rewards_G = [reward(tokenizer.decode(s.tokens), row["answer"]) for s in sequences_G]
            mean_reward = sum(rewards_G) / len(rewards_G)
            rewards_P.append(mean_reward)
            advantages_G = [r - mean_reward for r in rewards_G]
            if all(adv == 0.0 for adv in advantages_G):
                continue  # no signal in this group
            for seq, advantage in zip(sequences_G, advantages_G):
                tokens_T, logprobs_T = list(seq.tokens), list(seq.logprobs)
                ob_len = prompt.length - 1
                model_input = prompt.append(types.EncodedTextChunk(tokens=tokens_T[:-1]))
                target_tokens = [0] * ob_len + tokens_T
                padded_logprobs = [0.0] * ob_len + logprobs_T
                padded_advantages = [0.0] * ob_len + [advantage] * (model_input.length - ob_len)
                datums_D.append(types.Datum(model_input=model_input, loss_fn_inputs={
                    "target_tokens": TensorData.from_torch(torch.tensor(target_tokens)),
                    "logprobs": TensorData.from_torch(torch.tensor(padded_logprobs)),
                    "advantages": TensorData.from_torch(torch.tensor(padded_advantages)),
                }))
        metrics = {"step": step, "reward_mean": sum(rewards_P) / len(rewards_P),
                   "datums": len(datums_D)}
        if datums_D:
            fwd_bwd_future = training_client.forward_backward(datums_D,
                                                              loss_fn="importance_sampling")
            optim_future = training_client.optim_step(adam_params)
            fwd_bwd_future.result()
            metrics.update(optim_future.result().metrics or {})
        metrics["seconds"] = time.time() - t0
        result["steps"].append(metrics)
        print(json.dumps(metrics), flush=True)
    if heldout:
        sampling_client = training_client.save_weights_and_get_sampling_client().result()
        result["eval"]["after"] = evaluate(sampling_client, tokenizer, heldout, eval_params,
                                           a.eval_samples, reward)
        print(f"held-out reward after: {result['eval']['after']}", flush=True)
    if a.out:
        Path(a.out).write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
