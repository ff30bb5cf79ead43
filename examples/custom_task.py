"""A custom task in a few lines: teach the model to answer "what comes after N?".

    python examples/custom_task.py            # embedded SmolLM2-135M, a few minutes on a CPU
    python examples/custom_task.py --tiny     # a tiny random model, seconds (used by the tests)

The three things a user writes: rows, a reward function over a typed Sample, and a config.
"""

import argparse
import re

import traingym
from traingym import Sample


def rows(numbers):
    return [{"prompt": f"What number comes right after {n}?", "answer": n + 1} for n in numbers]


def reward(sample: Sample) -> float:
    """1.0 when the first number in the completion is the answer, else 0.0."""
    match = re.search(r"-?\d+", sample.completion_text)
    return float(match is not None and int(match.group()) == sample.example["answer"])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tiny", action="store_true", help="tiny model, seconds-long run")
    parser.add_argument("--run-dir", default=None)
    args = parser.parse_args()

    overrides = {"steps": 20, "eval": {"num_prompts": 64}}
    if args.tiny:
        overrides = {"steps": 2, "eval": {"num_prompts": 8, "samples_per_prompt": 2}}
    config = traingym.build_config("tiny" if args.tiny else "default", overrides=overrides)

    result = traingym.train(
        config,
        dataset=rows(range(0, 200, 2)),  # train on even numbers ...
        eval_dataset=rows(range(1, 200, 2)),  # ... evaluate on odd ones
        reward=reward,
        run_dir=args.run_dir,
    )
    print("final training reward:", round(result.final_metrics["reward_mean"], 3))
    if result.eval.get("delta"):
        print("held-out change:", result.eval["delta"])


if __name__ == "__main__":
    main()
