"""Grade model-written code against hidden tests: run it in a sandbox, judge on the host.

Only the candidate's source, a small harness and the test inputs enter the sandbox; the
expected outputs, the comparison and the verdict never do. The harness writes one JSON line per
case and the host compares them, so early exits, SkipTest, always-equal objects, patched test
frameworks or clocks, and forged or duplicate result lines earn nothing.
Covered: pure functions over JSON-representable arguments and results.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

from traingym.sandbox.base import ExecResult, Limits, Sandbox

HARNESS = r'''
import json, os, sys
job = json.loads(sys.stdin.read())
out = os.dup(1)
os.dup2(2, 1)
sys.stdout = sys.stderr
def emit(obj):
    os.write(out, (json.dumps(obj) + "\n").encode())
ns = {"__name__": "solution"}
try:
    exec(compile(open("solution.py").read(), "solution.py", "exec"), ns)
except BaseException as e:
    emit({"load_error": (type(e).__name__ + ": " + str(e))[:300]})
    raise SystemExit(0)
fn = ns.get(job["entry"])
if not callable(fn):
    emit({"load_error": "no function named " + job["entry"]})
    raise SystemExit(0)
for i, args in enumerate(job["inputs"]):
    try:
        emit({"case": i, "value": fn(*args)})
    except BaseException as e:
        emit({"case": i, "error": (type(e).__name__ + ": " + str(e))[:300]})
'''

MAX_LINE = 64 << 10


@dataclass
class Verdict:
    passed: int
    total: int
    status: str  # "pass", "partial", "fail", "load_error", "no_results", "sandbox_limit"
    details: list[str] = field(default_factory=list)  # per failing case: why
    exec_result: ExecResult | None = None

    @property
    def reward(self) -> float:
        return self.passed / self.total if self.total else 0.0


def same(got, want) -> bool:
    """Structural equality of JSON data; bools are not numbers; NaN equals NaN."""
    if isinstance(want, bool) or isinstance(got, bool):
        return type(got) is type(want) and got == want
    if isinstance(want, (int, float)) and isinstance(got, (int, float)):
        return got == want or (isinstance(got, float) and isinstance(want, float)
                               and math.isnan(got) and math.isnan(want))
    if isinstance(want, (list, tuple)):
        return isinstance(got, list) and len(got) == len(want) and all(map(same, got, want))
    if isinstance(want, dict):
        return (isinstance(got, dict) and got.keys() == want.keys()
                and all(same(got[k], want[k]) for k in want))
    return type(got) is type(want) and got == want


def judge(stdout: bytes, expected: list) -> tuple[int, list[str], str | None]:
    """Count the cases whose single result line matches; return (passed, why-not, load error)."""
    lines: dict[int, list[dict]] = {}
    load_error = None
    for raw in stdout.splitlines():
        if len(raw) > MAX_LINE:
            continue
        try:
            obj = json.loads(raw)
        except ValueError:
            continue
        if not isinstance(obj, dict):
            continue
        if "load_error" in obj:
            load_error = str(obj["load_error"])[:300]
        elif type(obj.get("case")) is int:
            lines.setdefault(obj["case"], []).append(obj)
    passed, why = 0, []
    for i, want in enumerate(expected):
        got = lines.get(i, [])
        if len(got) != 1:
            why.append(f"case {i}: {len(got)} result lines")
        elif "error" in got[0]:
            why.append(f"case {i}: raised {got[0]['error']}")
        elif not same(got[0].get("value"), want):
            why.append(f"case {i}: got {json.dumps(got[0].get('value'))[:80]}")
        else:
            passed += 1
    return passed, why, load_error


async def grade(sandbox: Sandbox, code: str, entry: str, inputs: list[list], expected: list,
                limits: Limits | None = None) -> Verdict:
    """Run `code` on the hidden inputs in `sandbox` and judge its results against `expected`."""
    if len(inputs) != len(expected):
        raise ValueError(f"{len(inputs)} inputs but {len(expected)} expected values")
    job = json.dumps({"entry": entry, "inputs": inputs}).encode()
    result = await sandbox.exec(HARNESS, stdin=job, files={"solution.py": code.encode()},
                                limits=limits)
    passed, why, load_error = judge(result.stdout, expected)
    total = len(expected)
    if passed == total:
        status = "pass"
    elif result.killed_reason is not None:
        status = "sandbox_limit"
    elif load_error is not None:
        status = "load_error"
    elif not result.stdout.strip():
        status = "no_results"
    else:
        status = "partial" if passed else "fail"
    if load_error is not None:
        why.insert(0, f"load error: {load_error}")
    if result.killed_reason is not None:
        why.insert(0, f"killed: {result.killed_reason}")
    return Verdict(passed, total, status, why, result)


def extract_code(completion_text: str, prefill: str = "") -> str:
    """The program in a completion: the pre-fill plus the text up to the closing fence.
    The pre-fill opens a ```python block; without one, a fenced block is searched for."""
    text = prefill + completion_text
    start = text.find("```python")
    if start < 0:
        start = text.find("```")
        if start < 0:
            return text
        body = text[start + 3:]
    else:
        body = text[start + len("```python"):]
    end = body.find("```")
    return (body if end < 0 else body[:end]).strip("\n")
