"""Code tasks through the env path: `traingym eval --env traingym.envs.code_env:code_env` grades
completions in a sandbox (bwrap, the default backend: skipped locally without it, required under
CI). A scripted read-only engine (scripted_engine.py) writes a right body for even samples and a
wrong one for odd samples, so every figure is known: sampled mean 0.5, pass@1 0.5, pass@2 1.0,
greedy (sample 0) 1.0."""

from __future__ import annotations

import json

from prereq import require_sandbox
from traingym.cli import main
from traingym.sandbox import DEFAULT_BACKEND


def test_code_task_eval_in_the_sandbox(tmp_path, capsys):
    require_sandbox(DEFAULT_BACKEND)
    rows = [{"prompt": "Write add(a, b) returning the sum.", "entry": "add",
             "prefill": "```python\ndef add(", "inputs": [[1, 2], [3, 4], [-5, 5]],
             "expected": [3, 7, 0]}] * 1
    rows += [dict(rows[0], inputs=[[10, 20]], expected=[30])]
    (tmp_path / "code.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "ev"
    code = main(["eval", "tiny", "--preset", "tiny", "--dataset", str(tmp_path / "code.jsonl"),
                 "--env", "traingym.envs.code_env:code_env", "--engine",
                 "scripted_engine:ScriptedEngine", "--set", "task.prefill=",
                 "--set", "rollout.max_new_tokens=64", "--pass-k", "1,2", "--out", str(out)])
    assert code == 0, capsys.readouterr().err
    s = json.loads((out / "summary.json").read_text())["scores"]
    assert s["greedy"]["per_prompt"] == [1.0, 1.0]
    assert s["sampled"]["per_prompt"] == [0.5, 0.5]
    assert s["pass@1"]["mean"] == 0.5 and s["pass@2"]["mean"] == 1.0
    recs = [json.loads(ln) for ln in (out / "samples.jsonl").read_text().splitlines()]
    assert [r["reward"] for r in recs if r["mode"] == "sampled"] == [1.0, 0.0, 1.0, 0.0]
