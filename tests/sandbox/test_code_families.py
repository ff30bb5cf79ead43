"""The parameterised code problems (envs/code_families.py): enough held-out problems, disjoint
from the training ones, every reference passing its own hidden tests in the bwrap sandbox and
a sibling's reference (same family, another parameter) or a wrong body failing them."""

import asyncio
import json

import pytest
from prereq import require_sandbox

from traingym.envs.code_env import GRADING_LIMITS
from traingym.envs.code_families import (FAMILIES, check_disjoint, family_problems,
                                         family_rows)
from traingym.envs.code_grader import extract_code, grade
from traingym.sandbox import open_sandbox

TRAIN, HELDOUT = family_rows("train"), family_rows("heldout")


def test_at_least_64_heldout_problems_disjoint_from_training():
    assert len(HELDOUT) >= 64 and len(TRAIN) >= 64
    check_disjoint(TRAIN, HELDOUT)
    keys = [(r["family"], tuple(r["params"])) for r in TRAIN + HELDOUT]
    assert len(set(keys)) == len(keys)  # no problem twice
    assert len({r["prompt"] for r in TRAIN + HELDOUT}) == len(keys)
    assert {r["family"] for r in HELDOUT} == {f.name for f in FAMILIES}  # every family both sides
    assert {r["family"] for r in TRAIN} == {f.name for f in FAMILIES}


def test_check_disjoint_names_a_shared_problem():
    with pytest.raises(ValueError, match="1 held-out problems are also training"):
        check_disjoint(TRAIN, HELDOUT + [TRAIN[3]])
    renamed = dict(TRAIN[0], family="other", params=["x"])  # same prompt text, another key
    with pytest.raises(ValueError, match="also training"):
        check_disjoint(TRAIN, [renamed])


def test_rows_are_json_and_deterministic():
    assert json.loads(json.dumps(TRAIN + HELDOUT)) == TRAIN + HELDOUT
    assert family_rows("heldout") == HELDOUT
    for row in TRAIN + HELDOUT:
        assert row["prefill"] == f"```python\ndef {row['entry']}("
        assert row["entry"] in row["prompt"] and len(row["inputs"]) == len(row["expected"]) >= 8


def test_bad_split_and_family_are_named():
    with pytest.raises(ValueError, match="unknown split 'test'"):
        family_rows("test")
    with pytest.raises(ValueError, match="unknown problem families \\['nope'\\]"):
        family_rows("train", families=("arith", "nope"))
    assert {r["family"] for r in family_rows("train", families=("arith",))} == {"arith"}


def test_references_pass_and_siblings_fail_in_the_sandbox():
    """Every reference scores 1.0 on its own hidden tests; the next parameter's reference of
    the same family, and a body returning None, score below 1.0 (graded in one bwrap sandbox,
    as a completion: the pre-fill plus the rest of the reference)."""
    require_sandbox("bwrap", GRADING_LIMITS)
    problems = family_problems("train") + family_problems("heldout")
    siblings = {}
    for fam in FAMILIES:
        made = [fam.problem(p) for p in fam.params]
        for a, b in zip(made, made[1:] + made[:1]):
            siblings[a.key] = b

    async def main():
        sandbox = await open_sandbox("bwrap", GRADING_LIMITS)
        try:
            out = []
            for p in problems:
                row = p.row()
                completion = p.reference[len("def " + p.entry + "("):] + "```\nprose"
                code = extract_code(completion, row["prefill"])
                sib = siblings[p.key]
                wrong = sib.reference.replace(f"def {sib.entry}(", f"def {p.entry}(")
                none = p.reference.split("return")[0] + "return None\n"
                verdicts = [await grade(sandbox, src, p.entry, row["inputs"], row["expected"])
                            for src in (code, wrong, none)]
                out.append((p.problem_id, [v.reward for v in verdicts]))
            return out
        finally:
            await sandbox.close()

    results = asyncio.run(main())
    assert len(results) == len(TRAIN) + len(HELDOUT)
    assert [pid for pid, (ref, _, _) in results if ref != 1.0] == []
    assert [pid for pid, (_, sib, _) in results if sib >= 1.0] == []
    assert [pid for pid, (_, _, none) in results if none >= 1.0] == []
