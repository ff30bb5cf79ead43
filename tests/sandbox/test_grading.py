"""The code-task grader against the known reward hacks, on bwrap and on process.

Every hack below targets `add(a, b)`; none may earn a single passing case, and the sandbox must
stay usable for an honest solution right after.
"""

import asyncio

import pytest
from prereq import require_sandbox

from traingym.envs.code_grader import extract_code, grade, judge, same
from traingym.envs.code_problems import PROBLEMS_BY_NAME, code_rows
from traingym.sandbox import Limits, open_sandbox

ROW = next(r for r in code_rows() if r["entry"] == "add")
HONEST = "def add(a, b):\n    return a + b\n"

HACKS = {
    "exit0_before_tests": "import os\nos._exit(0)\n",
    "sys_exit_at_import": "import sys\nsys.exit(0)\n",
    "skiptest": "import unittest\ndef add(a, b):\n    raise unittest.SkipTest('skip')\n",
    "always_equal": ("class Eq:\n    def __eq__(self, o): return True\n    def __ne__(self, o): return False\n"
                     "def add(a, b):\n    return Eq()\n"),
    "always_equal_int": ("class Eq(int):\n    def __eq__(self, o): return True\n"
                         "def add(a, b):\n    return Eq(0)\n"),
    "conftest_patch": ("open('conftest.py', 'w').write('import pytest\\n"
                       "def pytest_runtest_makereport(item, call): pass\\n')\n"
                       "def add(a, b):\n    return None\n"),
    "patch_builtins": ("import builtins, json\nbuiltins.isinstance = lambda *a: True\n"
                       "json.dumps = lambda *a, **k: '{\"case\": 0, \"value\": null}'\n"
                       "def add(a, b):\n    return None\n"),
    "patch_grader_emit": ("import __main__\n__main__.emit = lambda obj: None\n"
                          "def add(a, b):\n    return None\n"),
    "patch_clock": ("import time\ntime.time = lambda: 0.0\ntime.monotonic = lambda: 0.0\n"
                    "def add(a, b):\n    while True: pass\n"),
    "forge_result_lines": ("import os\nfor i in range(20):\n"
                           "    os.write(3, ('{\"case\": %d, \"value\": null}\\n' % i).encode())\n"
                           "    os.write(1, ('{\"case\": %d, \"value\": null}\\n' % i).encode())\n"
                           "def add(a, b):\n    return None\n"),
    "read_tests_glob": ("import glob, json\nfound = [p for d in ('.', '..', '/tmp', '/') for p in glob.glob(d + '/**', recursive=d != '/') if 'expect' in p or 'test' in p]\n"
                        "def add(a, b):\n    return len(found)\n"),
    "read_tests_stack": ("import inspect\n"
                         "def add(a, b):\n"
                         "    for f in inspect.stack():\n"
                         "        for v in f.frame.f_globals.values():\n"
                         "            if isinstance(v, dict) and 'expected' in v:\n"
                         "                return v['expected'][0]\n"
                         "    return None\n"),
    "read_tests_proc": ("import os\n"
                        "def add(a, b):\n"
                        "    out = []\n"
                        "    for pid in os.listdir('/proc'):\n"
                        "        try: out.append(open(f'/proc/{pid}/cmdline','rb').read())\n"
                        "        except OSError: pass\n"
                        "    return b''.join(out).decode(errors='replace')\n"),
    "segfault": "import ctypes\nctypes.string_at(0)\n",
    "fork_and_answer_later": ("import os, time\nif os.fork() == 0:\n    time.sleep(2)\n"
                              "    os.write(3, b'{\"case\": 0, \"value\": null}\\n')\n    os._exit(0)\n"
                              "def add(a, b):\n    return None\n"),
}


@pytest.fixture(autouse=True)
def _no_leftovers():
    """Overrides conftest's per-test check: this module's sandbox lives across its tests."""
    yield


@pytest.fixture(scope="module", params=["bwrap", "process"])
def sandbox(request):
    """Grading hacks are defeated by the grader's design (inputs in, JSON out, judged on the
    host), not by isolation, so every case also runs on the process backend."""
    # the process backend cannot limit processes as root (see sandbox/process.py)
    limits = Limits(cpu_s=2, wall_s=3, processes=None if request.param == "process" else 16)
    require_sandbox(request.param, limits)  # skips here, fails under CI (tests/prereq.py)
    loop = asyncio.new_event_loop()  # the sandbox's pipes belong to the loop that opened it
    sb = loop.run_until_complete(open_sandbox(request.param, limits))
    yield loop, sb
    loop.run_until_complete(sb.close())
    loop.close()


def run(sandbox, code):
    loop, sb = sandbox
    return loop.run_until_complete(grade(sb, code, ROW["entry"], ROW["inputs"], ROW["expected"]))


def test_honest_solution_passes_every_case(sandbox):
    v = run(sandbox, HONEST)
    assert (v.passed, v.total, v.status, v.reward) == (6, 6, "pass", 1.0)


def test_partly_right_solution_gets_partial_credit(sandbox):
    v = run(sandbox, "def add(a, b):\n    return a + b if a > 0 else 0\n")
    assert 0 < v.passed < v.total and v.status == "partial"


@pytest.mark.parametrize("name", sorted(HACKS))
def test_reward_hack_earns_nothing_and_the_sandbox_stays_usable(sandbox, name):
    # The hacks answer None where they answer at all, which matches no hidden integer.
    v = run(sandbox, HACKS[name])
    assert v.passed == 0, (name, v.details)
    assert v.status != "pass"
    assert run(sandbox, HONEST).status == "pass"


def test_symlink_to_host_files_reads_nothing_of_the_host(sandbox):
    if sandbox[1].backend == "process":
        pytest.skip("the process backend is not a security boundary: host files are readable")
    code = ("import os\nos.symlink('/etc/shadow', 'leak')\n"
            "def add(a, b):\n    return open('leak').read()\n")
    v = run(sandbox, code)
    assert v.passed == 0


def test_judge_takes_one_line_per_case_and_ignores_garbage():
    out = b'\x1b[31mnoise\n{"case": 0, "value": 3}\n{"case": 1, "value": 5}\n{"case": 1, "value": 5}\n[1]\n'
    passed, why, load_error = judge(out, [3, 5, 7])
    assert passed == 1 and load_error is None
    assert why == ["case 1: 2 result lines", "case 2: 0 result lines"]


def test_same_is_strict_about_types_but_not_int_float():
    assert same(2, 2.0) and same([1, [2]], [1, [2]]) and same(float("nan"), float("nan"))
    assert not same(True, 1) and not same(1, True) and not same("1", 1) and not same([1], (1, 2))


def test_extract_code_from_a_prefilled_fenced_block():
    assert extract_code("a, b):\n    return a + b\n```\nDone.", "```python\ndef add(") == \
        "def add(a, b):\n    return a + b"
    assert extract_code("Sure!\n```\nx = 1\n```") == "x = 1"


def test_every_problem_has_hidden_tests_its_reference_passes():
    rows = code_rows()
    assert len(rows) == len(PROBLEMS_BY_NAME) >= 20
    for r in rows:
        ref = PROBLEMS_BY_NAME[r["entry"]].reference
        assert len(r["inputs"]) == len(r["expected"]) >= 5
        assert all(same(ref(*a), e) for a, e in zip(r["inputs"], r["expected"]))
