"""RL through the Tinker API: examples/tinker/rl_loop.py against `traingym tinker`, held-out
sampled reward before and after.

Starts `traingym tinker` (a subprocess on a free port, the key from --api-key-env, serving
--model: default the embedded SmolLM2-135M-Instruct), runs examples/tinker/rl_loop.py (the
tinker-cookbook's rl_loop shape, the `tinker` SDK only) in the client environment
(.venv-tinker's interpreter when it exists, else this one) on traingym's `arith` task with the
exact-answer reward, and reports the held-out reward (mean over --eval-prompts held-out prompts
of --eval-samples sampled completions each, at the training temperature) before and after
training, each with its standard error over prompts, and the change with the standard error of
the per-prompt paired differences (both evals use the same sampling seed). Also per-step
train reward, datums and seconds. A full run (the defaults: 10 steps of 8 prompts x 8
completions, 128 x 4 held-out samples twice) takes of the order of half an hour on 2 shared
cores (estimated from the smoke runs, not measured). Writes a new result file with its provenance
(benchmarks/resultfile.py).

    .venv/bin/python benchmarks/tinker_rl.py      # -> results/tinker_rl/<date>-<commit>.json
    .venv/bin/python benchmarks/tinker_rl.py --model tiny --steps 1 --batch-size 2 \
        --group-size 2 --eval-prompts 4 --out /tmp/tinker_rl_smoke.json    # smoke
"""

from __future__ import annotations

import argparse
import json
import math
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import resultfile

ROOT = resultfile.ROOT
EXAMPLE = ROOT / "examples" / "tinker" / "rl_loop.py"
KEY_VAR = "TRAINGYM_BENCH_TINKER_KEY"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(url: str, proc: subprocess.Popen, log: Path, timeout: float = 180) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise SystemExit(f"traingym tinker exited {proc.returncode}:\n{log.read_text()}")
        try:
            if httpx.get(url + "/api/v1/healthz").status_code == 200:
                return
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            raise SystemExit(f"traingym tinker did not answer in {timeout:.0f}s")
        time.sleep(0.3)


def add_client_python(parser) -> None:
    parser.add_argument("--client-python", default=None, help="interpreter that runs the "
                        "example (default .venv-tinker's, else this)")


def client_interpreter(chosen: str | None) -> str:
    """--client-python, else .venv-tinker's interpreter where it exists, else this one."""
    client = chosen or str(ROOT / ".venv-tinker" / "bin" / "python")
    return client if Path(client).is_file() else sys.executable


def client_versions(python: str) -> dict:
    """The client environment's tinker, transformers and torch versions (from its metadata)."""
    code = ("import json; from importlib import metadata as m; print(json.dumps({n: m.version(n) "
            "for n in ('tinker', 'transformers', 'torch')}))")
    out = subprocess.run([python, "-c", code], capture_output=True, text=True, check=False)
    return json.loads(out.stdout) if out.returncode == 0 else {"error": out.stderr[-500:]}


def paired_delta(before: list[float], after: list[float]) -> dict:
    diffs = [b - a for a, b in zip(before, after)]
    n = len(diffs)
    mean = sum(diffs) / n
    var = sum((d - mean) ** 2 for d in diffs) / (n - 1) if n > 1 else 0.0
    return {"mean": mean, "se_paired": math.sqrt(var / n), "n": n}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="embedded")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--learning-rate", type=float, default=4e-4,
                   help="LoRA scale alpha/rank is 1 here (the server's lora_alpha 32, rank 32): "
                   "4e-4 is the update size of benchmarks/lora.py's 2e-4 at scale 2")
    p.add_argument("--lora-rank", type=int, default=32)
    p.add_argument("--eval-prompts", type=int, default=128)
    p.add_argument("--eval-samples", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", default="1", help="OMP_NUM_THREADS of the server (torch's "
                   "threads); on this shared 2-core machine 1 sampled 4-8x faster than torch's "
                   "default under load")
    add_client_python(p)
    resultfile.add_args(p)
    a = p.parse_args()
    rec = resultfile.start("tinker_rl", a)
    client = client_interpreter(a.client_python)
    key = "tml-bench-" + os.urandom(12).hex()
    with tempfile.TemporaryDirectory(prefix="tinker_rl_") as tmp:
        tmp = Path(tmp)
        config = tmp / "tinker.json"
        config.write_text(json.dumps({"tinker": {"models": [a.model],
                                                 "runs_dir": str(tmp / "runs")}}))
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        env = {**os.environ, KEY_VAR: key, "OMP_NUM_THREADS": a.threads,
               "PYTHONPATH": os.pathsep.join([str(ROOT / "src"),
                                              os.environ.get("PYTHONPATH", "")])}
        log = tmp / "server.log"
        with log.open("w") as out:
            server = subprocess.Popen([sys.executable, "-m", "traingym.cli", "tinker",
                                       str(config), "--port", str(port), "--api-key-env",
                                       KEY_VAR], stdout=out, stderr=subprocess.STDOUT, env=env)
        try:
            wait_healthy(url, server, log)
            t0 = time.time()
            client_env = {k: v for k, v in os.environ.items()
                          if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
            client_env.update(TINKER_API_KEY=key, OMP_NUM_THREADS="1")
            cmd = [client, str(EXAMPLE), "--base-url", url, "--model", a.model,
                   "--steps", str(a.steps), "--batch-size", str(a.batch_size),
                   "--group-size", str(a.group_size), "--max-tokens", str(a.max_tokens),
                   "--learning-rate", str(a.learning_rate), "--lora-rank", str(a.lora_rank),
                   "--eval-prompts", str(a.eval_prompts), "--eval-samples", str(a.eval_samples),
                   "--seed", str(a.seed), "--reward", "exact", "--out", str(tmp / "rl.json")]
            run = subprocess.run(cmd, env=client_env, cwd=tmp, check=False)
            wall = time.time() - t0
            if run.returncode != 0:
                raise SystemExit(f"examples/tinker/rl_loop.py exited {run.returncode}; server "
                                 f"log:\n{log.read_text()[-4000:]}")
            example = json.loads((tmp / "rl.json").read_text())
        finally:
            server.terminate()
            server.wait(30)
    before, after = example["eval"]["before"], example["eval"]["after"]
    result = {
        "model": a.model, "task": "arith (exact answer, prefill 'The answer is')",
        "client_python": client, "client_versions": client_versions(client),
        "example_args": example["config"],
        "heldout_reward_before": {k: before[k] for k in ("reward_mean", "reward_se", "n",
                                                         "samples_per_prompt")},
        "heldout_reward_after": {k: after[k] for k in ("reward_mean", "reward_se", "n",
                                                       "samples_per_prompt")},
        "heldout_reward_delta": paired_delta(before["per_prompt"], after["per_prompt"]),
        "steps": example["steps"],
        "seconds_total": wall,
        "seconds_per_step_mean": sum(s["seconds"] for s in example["steps"])
        / max(1, len(example["steps"])),
        "server_omp_num_threads": a.threads,
    }
    print(json.dumps({k: v for k, v in result.items() if k != "steps"}, indent=1))
    rec.write(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
