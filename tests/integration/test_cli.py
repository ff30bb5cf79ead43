import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_help_answers_fast():
    best = min(_timed([sys.executable, "-m", "traingym.cli", "--help"]) for _ in range(3))
    assert best < 1.0, f"traingym --help took {best:.2f}s"


def _timed(cmd):
    t0 = time.monotonic()
    subprocess.run(cmd, check=True, capture_output=True)
    return time.monotonic() - t0


def test_tiny_preset_end_to_end(tmp_path):
    p = subprocess.run([sys.executable, "-m", "traingym.cli", "train", "--preset", "tiny",
                        "--set", "steps=3", "--run-dir", str(tmp_path / "r")],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    run = tmp_path / "r"
    events = [json.loads(x) for x in (run / "events.jsonl").read_text().splitlines()]
    assert [e["step"] for e in events] == [1, 2, 3]
    for key in ("reward_mean", "reward_std", "loss", "kl", "entropy", "completion_len_mean",
                "tokens_per_s", "seconds_rollout", "seconds_train"):
        assert key in events[0]
    assert (run / "checkpoints" / "step_000003" / "COMMITTED").is_file()
    assert json.loads((run / "config.json").read_text())["steps"] == 3
    report = json.loads((run / "results.json").read_text())["eval"]
    assert {"before", "after", "delta"} <= set(report)
    assert (run / "samples.jsonl").read_text().strip()


def test_examples_run_with_tiny_settings(tmp_path):
    for example in sorted((ROOT / "examples").glob("*.py")):
        p = subprocess.run([sys.executable, str(example), "--tiny", "--run-dir", str(tmp_path / example.stem)],
                           capture_output=True, text=True, timeout=600, env={**os.environ})
        assert p.returncode == 0, f"{example.name}: {p.stderr[-2000:]}"
