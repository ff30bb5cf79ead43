"""Code-execution RL: the policy writes small Python functions, hidden tests grade them in a sandbox.

    python examples/code_task.py            # embedded SmolLM2-135M, minutes on a CPU
    python examples/code_task.py --tiny     # a tiny random model, seconds (used by the tests)

Each prompt asks for one function (envs/code_problems.py) and is pre-filled with the start of
the answer ("```python\\ndef add("). The program runs in a bwrap sandbox from a warm pool; the
reward is the fraction of hidden tests passed, judged outside the sandbox (envs/code_grader.py).
Train and held-out rows are different problems.
"""

import argparse

import traingym
from traingym.envs.code_env import CodeEnvMaker
from traingym.envs.code_problems import code_rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tiny", action="store_true", help="tiny model, seconds-long run")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--backend", default="bwrap", help="sandbox backend (bwrap or process)")
    parser.add_argument("--requirement", action="append", default=[],
                        help="a package the sandbox image provides (repeatable, e.g. numpy); "
                        "none: the standard library only (docs/sandbox.md)")
    parser.add_argument("--run-dir", default=None)
    args = parser.parse_args()

    rows = code_rows(seed=0)
    train_rows, heldout = rows[:20], rows[20:]
    overrides = {"steps": args.steps, "task": {"prefill": ""},
                 "rollout": {"prompts_per_step": 8, "group_size": 4, "max_new_tokens": 40},
                 "eval": {"num_prompts": len(heldout), "samples_per_prompt": 4}}
    if args.tiny:
        overrides = {"steps": 2, "task": {"prefill": ""}, "rollout": {"max_new_tokens": 16},
                     "eval": {"num_prompts": 4, "samples_per_prompt": 2}}
    config = traingym.build_config("tiny" if args.tiny else "default", overrides=overrides)

    result = traingym.train(config, dataset=train_rows, eval_dataset=heldout,
                            env=CodeEnvMaker(args.backend, image={"requirements": args.requirement}),
                            run_dir=args.run_dir)
    final = result.final_metrics
    print("final training reward (fraction of hidden tests passed):",
          round(final["reward_mean"], 3))
    for mode, d in result.eval.get("delta", {}).items():
        print(f"held-out {mode}: {d['delta']:+.3f} ± {d['se']:.3f}")


if __name__ == "__main__":
    main()
