"""A multi-turn task: the environment checks each answer and asks again when it is wrong.

    python examples/multi_turn.py            # embedded SmolLM2-135M, minutes on a CPU
    python examples/multi_turn.py --tiny     # a tiny random model, seconds (used by the tests)

The environment is a MultiTurnEnv subclass with one method, `respond`: it reads the policy's
reply and returns the next user message, or `done` with a reward. Getting it right early pays
more: 1 on the first try, 1/2 on the second, 1/3 on the third; still wrong after
rollout.max_turns tries, 0. The environment's messages enter the context as token ids and are
masked out of the loss; only the policy's own tokens are trained on.
"""

import argparse
import random
import re

import traingym
from traingym.envs.multi_turn import MultiTurnEnv, Reply


class RetryArithmetic(MultiTurnEnv):
    async def respond(self, text: str) -> Reply:
        match = re.search(r"-?\d+", text)
        if match and int(match.group()) == self.example["answer"]:
            return Reply(reward=1.0 / self.transcript.turns, done=True)
        return Reply(messages=[{"role": "user", "content": "That is not right. Try again."}])


def rows(seed: int, n: int) -> list[dict]:
    rng = random.Random(seed)
    pairs = [(rng.randrange(20), rng.randrange(20)) for _ in range(n)]
    return [{"prompt": f"What is {a} + {b}?", "answer": a + b} for a, b in pairs]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tiny", action="store_true", help="tiny model, seconds-long run")
    parser.add_argument("--run-dir", default=None)
    args = parser.parse_args()

    overrides = {"steps": 20, "rollout": {"max_turns": 3, "max_new_tokens": 12},
                 "eval": {"num_prompts": 32}}
    if args.tiny:
        overrides = {"steps": 2, "rollout": {"max_turns": 3},
                     "eval": {"num_prompts": 4, "samples_per_prompt": 2}}
    config = traingym.build_config("tiny" if args.tiny else "default", overrides=overrides)

    result = traingym.train(config, dataset=rows(0, 200), eval_dataset=rows(1, 32),
                            env=RetryArithmetic, run_dir=args.run_dir)
    final = result.final_metrics
    print("final training reward:", round(final["reward_mean"], 3),
          " turns per episode:", round(final["turns_mean"], 2))


if __name__ == "__main__":
    main()
