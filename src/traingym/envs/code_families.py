"""Parameterised families of small Python function tasks, split into train and held-out by
parameter, so a held-out pass rate means something for code-execution RL.

A family is a template ("returns x plus K") and parameter values; even positions train, odd
ones are held out (`split_of`), disjoint by construction (`check_disjoint` asserts it). Each
problem's reference source is the single source of truth: expected outputs are computed on the
host by running it, and only inputs enter a sandbox (envs/code_grader.py). Rows have
code_problems.code_rows' keys plus `family` and `params`. Tasks are sized so
SmolLM2-135M-Instruct solves some of them: RL needs a pass rate strictly between 0 and 1.
Not covered: multi-function problems, stateful or I/O tasks, difficulty levels.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

SPLITS = ("train", "heldout")
N_TESTS = 8


@dataclass(frozen=True)
class FamilyProblem:
    family: str
    params: tuple  # the parameter value that made it, e.g. ("add", 7)
    entry: str
    signature: str  # e.g. "(x: int) -> int"
    description: str
    reference: str  # Python source of a correct solution
    inputs: tuple[tuple, ...]  # hidden test inputs (arguments of each call)

    @property
    def key(self) -> tuple[str, tuple]:
        return self.family, self.params

    @property
    def problem_id(self) -> str:
        return f"{self.family}:" + ",".join(map(str, self.params))

    def prompt(self) -> str:
        return (f"Write a Python function `{self.entry}{self.signature}` that "
                f"{self.description}. Reply with the code only, in a ```python block.")

    def expected(self) -> list:
        """The reference's outputs on the hidden inputs, computed on the host."""
        ns: dict[str, Any] = {}
        exec(compile(self.reference, f"<reference {self.problem_id}>", "exec"), ns)
        fn = ns[self.entry]
        return [_jsonish(fn(*args)) for args in self.inputs]

    def row(self) -> dict[str, Any]:
        return {"prompt": self.prompt(), "problem": self.problem_id, "entry": self.entry,
                "prefill": f"```python\ndef {self.entry}(", "family": self.family,
                "params": list(self.params), "inputs": [list(a) for a in self.inputs],
                "expected": self.expected()}


def _jsonish(value):
    """Tuples as lists, as they come back from the sandbox's JSON."""
    if isinstance(value, tuple | list):
        return [_jsonish(v) for v in value]
    return value


@dataclass(frozen=True)
class Family:
    name: str
    params: tuple[tuple, ...]  # every parameter value, in a fixed order
    make: Callable[..., tuple[str, str, str, str]]  # params -> entry, signature, description, body
    inputs: Callable[[random.Random, tuple], list[tuple]]  # (rng, params) -> N_TESTS inputs

    def problem(self, params: tuple) -> FamilyProblem:
        entry, signature, description, body = self.make(*params)
        arg_names = signature[1:signature.index(")")]
        names = ", ".join(a.split(":")[0].strip() for a in arg_names.split(","))
        source = f"def {entry}({names}):\n    return {body}\n"
        rng = random.Random(f"{self.name}:{params}")
        return FamilyProblem(self.name, params, entry, signature, description, source,
                             tuple(self.inputs(rng, params)))


# -- inputs --------------------------------------------------------------------------------

def _ints_around(k: int, spread: int = 30):
    """Integers near k (k itself, k +- 1, 0 and negatives included): comparisons and
    arithmetic with k are told apart from those with another constant."""
    def gen(r: random.Random, params) -> list[tuple]:
        fixed = [k, k + 1, k - 1, 0]
        return [(x,) for x in fixed + [r.randint(-spread, spread) for _ in range(N_TESTS - 4)]]
    return gen


def _small_ints(r: random.Random, params) -> list[tuple]:
    return [(x,) for x in [0, 1, -1] + [r.randint(-40, 40) for _ in range(N_TESTS - 3)]]


def _multiples(r: random.Random, params) -> list[tuple]:
    """Multiples of k and 1..12 (a multiple of a divisor of k that is not one of k tells
    k apart from that divisor)."""
    k = params[0]
    xs = [0, k, 2 * k, -k, k + 1] + list(range(1, 13)) + [r.randint(-60, 60) for _ in range(3)]
    return [(x,) for x in xs]


def _int_lists(r: random.Random, params) -> list[tuple]:
    k = params[-1] if isinstance(params[-1], int) else 0
    out = [([],), ([k, k + 1, k - 1],)]
    while len(out) < N_TESTS:
        out.append(([r.randint(-10, 15) for _ in range(r.randint(1, 7))],))
    return out


_WORDS = ("apple", "level", "banana", "tree", "hello", "data", "moon", "a", "abc", "stats",
          "python", "mississippi", "bookkeeper", "x", "queue", "letter")


def _words(r: random.Random, params) -> list[tuple]:
    out = [("",), ("banana",)]
    if params and isinstance(params[-1], str) and len(params[-1]) == 1:
        c = params[-1]
        out.append((f"{c}{c}{c}b{c}",))  # told apart from any other letter's count
    while len(out) < N_TESTS:
        out.append((r.choice(_WORDS),))
    return out


# -- families ------------------------------------------------------------------------------

_OPS = {"add": ("plus", "+"), "subtract": ("minus", "-"), "multiply": ("times", "*")}
_CMP = {"greater": ("greater than", ">"), "less": ("less than", "<")}
_LETTERS = tuple("aeilnoprst")
_AFFIXES = ("un", "re", "pre", "ing", "ed", "ly", "er", "ful", "ness", "mis", "dis", "able")
_PAIRS = (("yes", "no"), ("even", "odd"), ("on", "off"), ("hot", "cold"), ("up", "down"),
          ("left", "right"), ("red", "blue"), ("big", "small"), ("win", "lose"), ("a", "b"))


def _arith(op, k):
    word, sym = _OPS[op]
    return f"{op}_{k}", "(x: int) -> int", f"returns x {word} {k}", f"x {sym} {k}"


def _compare(op, k):
    word, sym = _CMP[op]
    return (f"is_{op}_than_{k}", "(x: int) -> bool",
            f"returns True if x is {word} {k}, else False", f"x {sym} {k}")


def _divisible(k):
    return (f"is_divisible_by_{k}", "(x: int) -> bool",
            f"returns True if x is divisible by {k}, else False", f"x % {k} == 0")


def _remainder(k):
    return (f"mod_{k}", "(x: int) -> int", f"returns the remainder of x divided by {k}",
            f"x % {k}")


def _linear(a, b):
    return (f"linear_{a}_{b}", "(x: int) -> int", f"returns {a} * x + {b}", f"{a} * x + {b}")


def _bound(op, k):
    if op == "at_least":
        return (f"at_least_{k}", "(x: int) -> int", f"returns the larger of x and {k}",
                f"max(x, {k})")
    return f"at_most_{k}", "(x: int) -> int", f"returns the smaller of x and {k}", f"min(x, {k})"


def _map_list(op, k):
    if op == "add":
        return (f"add_{k}_to_each", "(xs: list[int]) -> list[int]",
                f"returns a new list with {k} added to each element of xs",
                f"[x + {k} for x in xs]")
    return (f"multiply_each_by_{k}", "(xs: list[int]) -> list[int]",
            f"returns a new list with each element of xs multiplied by {k}",
            f"[x * {k} for x in xs]")


def _count_greater(k):
    return (f"count_greater_than_{k}", "(xs: list[int]) -> int",
            f"returns how many elements of xs are greater than {k}",
            f"sum(1 for x in xs if x > {k})")


def _count_char(c):
    return (f"count_{c}", "(s: str) -> int",
            f"returns the number of times the letter '{c}' appears in s", f"s.count({c!r})")


def _affix(where, w):
    if where == "prefix":
        return (f"add_prefix_{w}", "(s: str) -> str", f"returns '{w}' followed by s",
                f"{w!r} + s")
    return f"add_suffix_{w}", "(s: str) -> str", f"returns s followed by '{w}'", f"s + {w!r}"


def _slice(end, k):
    if end == "first":
        return (f"first_{k}_chars", "(s: str) -> str", f"returns the first {k} characters of s",
                f"s[:{k}]")
    return (f"last_{k}_chars", "(s: str) -> str", f"returns the last {k} characters of s",
            f"s[-{k}:]")


def _repeat(k):
    return f"repeat_{k}_times", "(s: str) -> str", f"returns s repeated {k} times", f"s * {k}"


def _parity(a, b):
    return (f"{a}_if_even_else_{b}", "(x: int) -> str",
            f"returns '{a}' if x is even, else '{b}'", f"{a!r} if x % 2 == 0 else {b!r}")


def _around(r, params):
    return _ints_around(params[-1])(r, params)


FAMILIES: tuple[Family, ...] = (
    Family("arith", tuple((op, k) for op in _OPS for k in range(2, 10)), _arith, _small_ints),
    Family("compare", tuple((op, k) for op in _CMP for k in range(1, 9)), _compare, _around),
    Family("divisible", tuple((k,) for k in range(2, 12)), _divisible, _multiples),
    Family("remainder", tuple((k,) for k in range(2, 12)), _remainder, _multiples),
    Family("linear", tuple((a, b) for a in (2, 3, 4) for b in (1, 2, 3, 5)), _linear,
           _small_ints),
    Family("bound", tuple((op, k) for op in ("at_least", "at_most") for k in range(0, 6)),
           _bound, _around),
    Family("map_list", tuple((op, k) for op in ("add", "multiply") for k in range(2, 8)),
           _map_list, _int_lists),
    Family("count_greater", tuple((k,) for k in range(0, 8)), _count_greater, _int_lists),
    Family("count_char", tuple((c,) for c in _LETTERS), _count_char, _words),
    Family("affix", tuple((w, a) for w in ("prefix", "suffix") for a in _AFFIXES[:6]), _affix,
           _words),
    Family("slice", tuple((e, k) for e in ("first", "last") for k in range(1, 6)), _slice,
           _words),
    Family("repeat", tuple((k,) for k in range(2, 8)), _repeat, _words),
    Family("parity", _PAIRS, _parity, _small_ints),
)
FAMILIES_BY_NAME = {f.name: f for f in FAMILIES}


def split_of(index: int) -> str:
    """Which split the parameter value at `index` of its family belongs to."""
    return SPLITS[index % 2]


def family_problems(split: str) -> list[FamilyProblem]:
    """Every problem of `split` ('train' or 'heldout'), family by family."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; choose one of {SPLITS}")
    return [fam.problem(p) for fam in FAMILIES for i, p in enumerate(fam.params)
            if split_of(i) == split]


def family_rows(split: str, families: tuple[str, ...] | None = None) -> list[dict[str, Any]]:
    """Dataset rows of `split` (CodeEnv's keys plus family and params), optionally only of
    the named families."""
    if families is not None:
        unknown = sorted(set(families) - set(FAMILIES_BY_NAME))
        if unknown:
            raise ValueError(f"unknown problem families {unknown}; choose from "
                             f"{sorted(FAMILIES_BY_NAME)}")
    return [p.row() for p in family_problems(split)
            if families is None or p.family in families]


def check_disjoint(train: list[dict], heldout: list[dict]) -> None:
    """Raise if a held-out row shares its (family, params) or its prompt with a training row."""
    keys = {(r["family"], tuple(r["params"])) for r in train}
    prompts = {r["prompt"] for r in train}
    shared = [r["problem"] for r in heldout
              if (r["family"], tuple(r["params"])) in keys or r["prompt"] in prompts]
    if shared:
        raise ValueError(f"{len(shared)} held-out problems are also training problems: "
                         f"{shared[:5]}")
