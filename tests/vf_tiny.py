"""Small verifiers environments written against verifiers' real classic API (0.2-0.3), loaded
by `vf.load_environment("vf-tiny", kind=...)` like an installed environment package (this
module is on the test path). Offline: their datasets are built in memory.

- kind="single": vf.SingleTurnEnv over a-plus-b questions; rubric: exact answer (weight 1.0)
  and the digit fraction of the parsed answer (weight 0.5: a signal even a random tiny model
  gets), parser vf.Parser.
- kind="multi": a vf.MultiTurnEnv number-guessing game (env_response says Higher/Lower,
  a solved game ends through state["final_env_response"]); reward 1.0 when solved.
- kind="tool": vf.ToolEnv with an `add(a, b)` tool; reward: the last message holds the sum.
"""

import re

import verifiers as vf
from datasets import Dataset


def _rows(n: int = 24) -> list[dict]:
    return [{"question": f"What is {a} + {b}?", "answer": str(a + b)}
            for a in range(1, 7) for b in range(1, 5)][:n]


def exact(parser, completion, answer) -> float:
    return 1.0 if (parser.parse_answer(completion) or "").strip() == answer else 0.0


def digits(parser, completion) -> float:
    text = parser.parse_answer(completion) or ""
    return sum(c.isdigit() for c in text) / len(text) if text else 0.0


class GuessEnv(vf.MultiTurnEnv):
    async def setup_state(self, state):
        state["target"] = int(state["answer"])
        state["solved"] = False
        return state

    async def env_response(self, messages, state, **kwargs):
        m = re.search(r"-?\d+", messages[-1].content or "")
        if m is None:
            return [vf.UserMessage(content="Answer with one number.")]
        guess = int(m.group())
        if guess == state["target"]:
            state["solved"] = True
            state["final_env_response"] = [vf.UserMessage(content="Correct.")]  # ends it now
            return state["final_env_response"]
        return [vf.UserMessage(content="Higher." if guess < state["target"] else "Lower.")]


def solved(state) -> float:
    return 1.0 if state.get("solved") else 0.0


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: the first number
        b: the second number
    """
    return a + b


def sum_in_answer(completion, answer) -> float:
    last = completion[-1]
    return 1.0 if answer in (last.content or "") else 0.0


def load_environment(kind: str = "single", n: int = 24):
    rows = _rows(n)
    if kind == "single":
        parser = vf.Parser()
        return vf.SingleTurnEnv(
            dataset=Dataset.from_list(rows[:-4]), eval_dataset=Dataset.from_list(rows[-4:]),
            system_prompt="Answer with the number only.", parser=parser,
            rubric=vf.Rubric(funcs=[exact, digits], weights=[1.0, 0.5], parser=parser))
    if kind == "multi":
        games = [{"question": "Guess my number from 1 to 10.", "answer": str(1 + i % 10)}
                 for i in range(n)]
        return GuessEnv(dataset=Dataset.from_list(games), max_turns=3,
                        rubric=vf.Rubric(funcs=[solved], weights=[1.0]))
    if kind == "tool":
        return vf.ToolEnv(dataset=Dataset.from_list(rows), tools=[add], max_turns=3,
                          rubric=vf.Rubric(funcs=[sum_in_answer], weights=[1.0]))
    raise ValueError(f"kind must be 'single', 'multi' or 'tool', not {kind!r}")
