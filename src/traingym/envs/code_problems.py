"""Built-in programming problems with hidden tests, for code-execution RL.

Each problem names a function, describes it, and carries a reference solution that exists only
on the host: the hidden tests are inputs plus the reference's outputs, computed here and never
sent into a sandbox (the candidate sees one input at a time, never an expected value).
`code_rows()` gives dataset rows {prompt, entry, problem, inputs, expected}; the grader in
envs/code_grader.py runs them.

The problems are deliberately small (one short function each) so that a 135M-parameter model
solves some of them some of the time: RL needs a reward that is neither always 0 nor always 1.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Problem:
    entry: str  # function name
    signature: str  # e.g. "(a: int, b: int) -> int"
    description: str
    reference: Callable[..., Any]
    inputs: Callable[[random.Random], list[tuple]]  # hidden test inputs, from a seeded RNG


def _ints(n, lo=-50, hi=50):
    return lambda r: [tuple(r.randint(lo, hi) for _ in range(n)) for _ in range(6)]


def _int_lists(lo=-20, hi=20):
    return lambda r: [([r.randint(lo, hi) for _ in range(r.randint(1, 8))],) for _ in range(6)]


_WORDS = ["apple", "level", "banana", "racecar", "Moon", "noon", "tree", "stats", "hello world",
          "a b c", "Python", "abba", "xyz", "Was it a car", "madam", "data"]


def _strings():
    return lambda r: [(r.choice(_WORDS),) for _ in range(6)]


PROBLEMS = [
    Problem("add", "(a: int, b: int) -> int", "returns the sum of a and b", lambda a, b: a + b, _ints(2)),
    Problem("subtract", "(a: int, b: int) -> int", "returns a minus b", lambda a, b: a - b, _ints(2)),
    Problem("multiply", "(a: int, b: int) -> int", "returns the product of a and b",
            lambda a, b: a * b, _ints(2)),
    Problem("square", "(x: int) -> int", "returns x squared", lambda x: x * x, _ints(1)),
    Problem("double", "(x: int) -> int", "returns twice x", lambda x: 2 * x, _ints(1)),
    Problem("negate", "(x: int) -> int", "returns -x", lambda x: -x, _ints(1)),
    Problem("absolute", "(x: int) -> int", "returns the absolute value of x", abs, _ints(1)),
    Problem("maximum", "(a: int, b: int) -> int", "returns the larger of a and b", max, _ints(2)),
    Problem("minimum", "(a: int, b: int) -> int", "returns the smaller of a and b", min, _ints(2)),
    Problem("is_even", "(x: int) -> bool", "returns True if x is even, else False",
            lambda x: x % 2 == 0, _ints(1)),
    Problem("is_positive", "(x: int) -> bool", "returns True if x is greater than 0",
            lambda x: x > 0, _ints(1)),
    Problem("last_digit", "(x: int) -> int", "returns the last decimal digit of x (x >= 0)",
            lambda x: x % 10, _ints(1, 0, 999)),
    Problem("list_sum", "(xs: list[int]) -> int", "returns the sum of the list", sum, _int_lists()),
    Problem("list_max", "(xs: list[int]) -> int", "returns the largest element of the list",
            max, _int_lists()),
    Problem("list_len", "(xs: list[int]) -> int", "returns the number of elements", len, _int_lists()),
    Problem("first", "(xs: list[int]) -> int", "returns the first element", lambda xs: xs[0],
            _int_lists()),
    Problem("last", "(xs: list[int]) -> int", "returns the last element", lambda xs: xs[-1],
            _int_lists()),
    Problem("sort_list", "(xs: list[int]) -> list[int]", "returns the list sorted ascending",
            sorted, _int_lists()),
    Problem("reverse_list", "(xs: list[int]) -> list[int]", "returns the list reversed",
            lambda xs: xs[::-1], _int_lists()),
    Problem("count_positive", "(xs: list[int]) -> int", "returns how many elements are > 0",
            lambda xs: sum(x > 0 for x in xs), _int_lists()),
    Problem("reverse_string", "(s: str) -> str", "returns s reversed", lambda s: s[::-1], _strings()),
    Problem("upper", "(s: str) -> str", "returns s in upper case", str.upper, _strings()),
    Problem("string_length", "(s: str) -> int", "returns the length of s", len, _strings()),
    Problem("is_palindrome", "(s: str) -> bool", "returns True if s reads the same backwards",
            lambda s: s == s[::-1], _strings()),
    Problem("count_vowels", "(s: str) -> int", "returns the number of vowels (aeiou, any case)",
            lambda s: sum(c in "aeiouAEIOU" for c in s), _strings()),
    Problem("first_char", "(s: str) -> str", "returns the first character of s", lambda s: s[0],
            _strings()),
    Problem("factorial", "(n: int) -> int", "returns n! (n >= 0)", math.factorial,
            _ints(1, 0, 12)),
    Problem("sum_to", "(n: int) -> int", "returns 1 + 2 + ... + n (n >= 0)",
            lambda n: n * (n + 1) // 2, _ints(1, 0, 100)),
]
PROBLEMS_BY_NAME = {p.entry: p for p in PROBLEMS}


def prompt_for(p: Problem) -> str:
    return (f"Write a Python function `{p.entry}{p.signature}` that {p.description}. "
            "Reply with the code only, in a ```python block.")


def code_rows(seed: int = 0) -> list[dict[str, Any]]:
    """One row per problem: the prompt, the entry point and the hidden tests (host-side only)."""
    rows = []
    for i, p in enumerate(PROBLEMS):
        inputs = p.inputs(random.Random(seed * 1000 + i))
        rows.append({
            "prompt": prompt_for(p),
            "problem": p.entry,
            "entry": p.entry,
            "prefill": f"```python\ndef {p.entry}(",
            "inputs": [list(args) for args in inputs],
            "expected": [p.reference(*args) for args in inputs],
        })
    return rows
