"""Tool use: the policy may call typed Python functions before it answers.

    python examples/tool_use.py            # embedded SmolLM2-135M, minutes on a CPU
    python examples/tool_use.py --tiny     # a tiny random model, seconds (used by the tests)

Tools are plain functions with type hints and a docstring; their JSON schemas reach the model
through the chat template. The policy calls one by writing
<tool_call>{"name": "multiply", "arguments": {"a": 3, "b": 4}}</tool_call>; the result comes
back as a tool message, and a malformed call comes back as an error message, never a crash.
The first turn without a tool call is the answer, scored by `reward`. A group hook then
takes 0.1 off each answer per turn more than the quickest sample of its group used.
"""

import argparse
import random
import re

import traingym
from traingym import Sample
from traingym.envs.tools import ToolTask


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: the first number
        b: the second number
    """
    return a + b


def multiply(a: int, b: int) -> int:
    """Multiply two integers.

    Args:
        a: the first number
        b: the second number
    """
    return a * b


def reward(sample: Sample) -> float:
    """1.0 when the last number of the final answer (not of a tool result) is right."""
    numbers = re.findall(r"-?\d+", sample.final_text)
    return float(bool(numbers) and int(numbers[-1]) == sample.example["answer"])


def fewer_turns(samples: list[Sample]) -> list[float]:
    quickest = min(s.turns for s in samples)
    return [s.reward - 0.1 * (s.turns - quickest) for s in samples]


def rows(seed: int, n: int) -> list[dict]:
    rng = random.Random(seed)
    pairs = [(rng.randrange(10, 40), rng.randrange(10, 40)) for _ in range(n)]
    return [{"prompt": f"What is {a} * {b}? Use a tool.", "answer": a * b} for a, b in pairs]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tiny", action="store_true", help="tiny model, seconds-long run")
    parser.add_argument("--run-dir", default=None)
    args = parser.parse_args()

    overrides = {"steps": 20, "task": {"prefill": ""},
                 "rollout": {"max_turns": 3, "max_new_tokens": 48}, "eval": {"num_prompts": 32}}
    if args.tiny:
        overrides = {"steps": 2, "task": {"prefill": ""}, "rollout": {"max_turns": 3},
                     "eval": {"num_prompts": 4, "samples_per_prompt": 2}}
    config = traingym.build_config("tiny" if args.tiny else "default", overrides=overrides)

    result = traingym.train(config, dataset=rows(0, 200), eval_dataset=rows(1, 32),
                            env=ToolTask([add, multiply], reward), group_reward=fewer_turns,
                            run_dir=args.run_dir)
    final = result.final_metrics
    print("final training reward:", round(final["reward_mean"], 3),
          " turns per episode:", round(final["turns_mean"], 2))


if __name__ == "__main__":
    main()
