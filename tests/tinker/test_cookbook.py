"""The tinker-cookbook's own loops, run the way its users run them: in their own client
environment (.venv-tinker: tinker-cookbook 0.5.8, tinker 0.38, transformers 5.5.4, no traingym),
over HTTP against `traingym tinker` started as a command (a subprocess on a free port, the key
from --api-key-env).

Covered:
- the cookbook's supervised trainer (`tinker_cookbook.supervised.train`, what
  recipes/sl_basic.py runs) on a local JSONL dataset, and recipes/sl_loop.py's `main`, each
  complete on the tiny model (LoRA, `cross_entropy`, AdamW, the final `save_state` and
  `save_weights_for_sampler`) and their train NLL falls, as does the trainer's held-out NLL (its
  SamplerNLLEvaluator: `compute_logprobs` on sampler snapshots); sl_loop run again resumes from
  its final state (create_training_client_from_state_with_optimizer);
- the SDK's `get_tokenizer()` (get_info's tokenizer_id, loaded with the client's transformers
  5.5.4) encodes as the server's tokenizer for `tiny` and `embedded`;
- examples/tinker/rl_loop.py (importance_sampling RL written against the SDK alone) runs 2 steps
  with its format reward, so it sends an importance_sampling step;
- the cookbook's RL trainer (`tinker_cookbook.rl.train`) runs from recipes/math_rl/train.py's
  own command line on its offline arithmetic environment; on the untrained tiny model its
  rewards are constant (no answer, no stop sequence in 5 tokens), so this shows the loop runs,
  not that it learns.
How each loop is driven, and which of the recipe's lookups need replacing offline, is in
cookbook_client.py.
Not covered: recipes/rl_loop.py itself (it loads openai/gsm8k from the hub and has no option
for a local dataset; examples/tinker/rl_loop.py is its shape on traingym's arithmetic task).

Without .venv-tinker the tests skip locally and fail under CI (tests/prereq.py); make it with
`bash scripts/setup_tinker_client.sh`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import free_port
from prereq import missing, require

import traingym

ROOT = Path(__file__).resolve().parents[2]
CLIENT = ROOT / ".venv-tinker" / "bin" / "python"
DRIVER = Path(__file__).with_name("cookbook_client.py")
SRC = os.path.dirname(os.path.dirname(traingym.__file__))
KEY_VAR, KEY = "TRAINGYM_TEST_TINKER_KEY", "tml-cookbook-test-0123456789"


def conversations(path: Path, n: int = 64) -> Path:
    """Chat rows {'messages': [user, assistant]} in the format FromConversationFileBuilder and
    no_robots share (tinker_cookbook/example_data/conversations.jsonl)."""
    import random

    rng = random.Random(0)
    with path.open("w") as f:
        for _ in range(n):
            a, b = rng.randrange(20), rng.randrange(20)
            f.write(json.dumps({"messages": [
                {"role": "user", "content": f"What is {a} + {b}?"},
                {"role": "assistant", "content": f"The answer is {a + b}."}]}) + "\n")
    return path


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    require("tinker", "`traingym tinker` needs the tinker SDK's request types")
    require("peft", "LoRA training clients need peft")
    if not CLIENT.is_file():
        missing(f"the Tinker client venv is absent ({CLIENT}): run "
                "`bash scripts/setup_tinker_client.sh`")
    from traingym.models.loader import load_policy

    tmp = tmp_path_factory.mktemp("cookbook")
    # The cookbook loads its tokenizer from the model name (a local folder when it is one), so
    # the tiny model is also served from a folder: the same weights as `tiny` (seed 0).
    folder = tmp / "tiny-folder"
    model, tok = load_policy("tiny")
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    config = tmp / "tinker.json"
    config.write_text(json.dumps({"tinker": {"models": [str(folder), "tiny", "embedded"],
                                             "runs_dir": str(tmp / "runs"), "poll_s": 2.0}}))
    port = free_port()
    env = {**os.environ, KEY_VAR: KEY, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")])}
    log = (tmp / "server.log").open("w")
    proc = subprocess.Popen([sys.executable, "-m", "traingym.cli", "tinker", str(config),
                             "--port", str(port), "--api-key-env", KEY_VAR],
                            stdout=log, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        import httpx

        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, (tmp / "server.log").read_text()
            try:
                if httpx.get(url + "/api/v1/healthz").status_code == 200:
                    break
            except httpx.TransportError:
                assert time.monotonic() < deadline, "the server did not start"
                time.sleep(0.2)
        yield {"url": url, "tmp": tmp, "folder": str(folder), "tokenizer": tok}
    finally:
        proc.terminate()
        proc.wait(30)
        log.close()


def client(args: list[str], tmp: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run .venv-tinker's interpreter (no traingym on its path) with the server's key."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(TINKER_API_KEY=KEY, OMP_NUM_THREADS="1", TINKER_COOKBOOK_RUNS_DIR=str(tmp))
    p = subprocess.run([str(CLIENT), *args], capture_output=True, text=True, timeout=timeout,
                       check=False,
                       cwd=tmp, env=env)
    assert p.returncode == 0, f"{args[:2]} exited {p.returncode}:\n{p.stdout[-3000:]}\n" \
                              f"{p.stderr[-6000:]}"
    return p


def train_nll(log_path: Path) -> list[float]:
    rows = [json.loads(line) for line in (log_path / "metrics.jsonl").read_text().splitlines()]
    return [r["train_mean_nll"] for r in rows if "train_mean_nll" in r]


@pytest.mark.parametrize("mode", ["sl_train", "sl_loop"])
def test_cookbook_supervised_loop_trains(server, mode):
    tmp = server["tmp"]
    log_path = tmp / mode
    cfg = {"base_url": server["url"], "log_path": str(log_path), "model_name": server["folder"],
           "renderer_name": "role_colon", "dataset": str(conversations(tmp / "conv.jsonl")),
           "batch_size": 8, "max_length": 128, "learning_rate": 1e-2, "lora_rank": 8, "steps": 6}
    if mode == "sl_train":  # 8 held-out conversations scored by the sampler before and after
        cfg.update(test_size=8, eval_every=5)
    out = client([str(DRIVER), mode, json.dumps(cfg)], tmp)
    assert "Training completed" in out.stderr + out.stdout
    nll = train_nll(log_path)
    assert len(nll) == 6, nll
    assert nll[-1] < 0.75 * nll[0], nll  # 6.1 -> 3.3 nats when written
    if mode == "sl_train":  # SamplerNLLEvaluator: compute_logprobs on sampler snapshots
        rows = [json.loads(x) for x in (log_path / "metrics.jsonl").read_text().splitlines()]
        test = [r["test/nll"] for r in rows if "test/nll" in r]
        assert len(test) == 2 and test[1] < 0.75 * test[0], test  # 6.1 -> 3.6 when written
    final = [json.loads(x) for x in (log_path / "checkpoints.jsonl").read_text().splitlines()]
    assert final[-1]["name"] == "final" and final[-1]["sampler_path"].startswith("tinker://")
    if mode == "sl_loop":  # run again: it resumes from its last state in a new session
        again = client([str(DRIVER), mode, json.dumps(cfg)], tmp)
        text = again.stderr + again.stdout
        assert "Resuming from batch 8" in text and "Training completed" in text


def test_cookbook_rl_recipe_runs_from_its_command_line(server):
    """recipes/math_rl/train.py, unchanged, from its own command line with documented options
    only: the cookbook's arithmetic environment (made locally, no dataset download), its full
    RL trainer (tinker_cookbook.rl.train: sampling with string stop sequences, importance
    sampling, checkpoints)."""
    tmp = server["tmp"]
    log_path = tmp / "math_rl"
    out = client(["-m", "tinker_cookbook.recipes.math_rl.train", "env=arithmetic",
                  f"model_name={server['folder']}", "renderer_name=role_colon",
                  f"base_url={server['url']}", "groups_per_batch=4", "group_size=4",
                  "max_tokens=5", "max_steps=2", "eval_every=0", "save_every=0", "lora_rank=8",
                  "learning_rate=1e-3", f"log_path={log_path}",
                  "behavior_if_log_dir_exists=delete"], tmp)
    assert "Training completed successfully" in out.stderr + out.stdout
    rows = [json.loads(x) for x in (log_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["progress/batch"] for r in rows if "env/all/reward/total" in r] == [0, 1]
    final = [json.loads(x) for x in (log_path / "checkpoints.jsonl").read_text().splitlines()]
    assert final[-1]["name"] == "final" and final[-1]["sampler_path"].startswith("tinker://")


def test_sdk_tokenizer_loads_in_the_client_env(server):
    from transformers import AutoTokenizer

    from traingym.models.embedded import embedded_model_dir

    text = "What is 3 + 4? The answer is 7."
    cfg = {"base_url": server["url"], "models": ["tiny", "embedded"], "text": text}
    out = client([str(DRIVER), "tokenizer", json.dumps(cfg)], server["tmp"])
    line = [x for x in out.stdout.splitlines() if x.startswith("TOKENS ")][-1]
    got = json.loads(line.removeprefix("TOKENS "))
    assert got["tiny"] == server["tokenizer"].encode(text, add_special_tokens=False)
    embedded = AutoTokenizer.from_pretrained(embedded_model_dir())
    assert got["embedded"] == embedded.encode(text, add_special_tokens=False)


def test_rl_example_runs(server):
    tmp = server["tmp"]
    out_json = tmp / "rl.json"
    client([str(ROOT / "examples" / "tinker" / "rl_loop.py"), "--base-url", server["url"],
            "--model", "tiny", "--steps", "2", "--batch-size", "4", "--group-size", "4",
            "--max-tokens", "8", "--eval-prompts", "4", "--reward", "digits",
            "--out", str(out_json)], tmp)
    result = json.loads(out_json.read_text())
    assert [s["step"] for s in result["steps"]] == [0, 1]
    # the format reward varies within groups, so importance_sampling steps ran
    assert all(s["datums"] > 0 and "grad_norm:mean" in s for s in result["steps"]), result
    for key in ("before", "after"):
        assert 0.0 <= result["eval"][key]["reward_mean"] <= 1.0
        assert result["eval"][key]["n"] == 4


def test_rl_example_data_is_traingyms_arith_task():
    from traingym.envs.tasks import builtin_task

    task = builtin_task("arith")
    rows = [json.loads(x) for x in
            (ROOT / "examples" / "tinker" / "arith.jsonl").read_text().splitlines()]
    want = [{**r, "split": "train"} for r in task.train] + \
        [{**r, "split": "heldout"} for r in task.heldout]
    assert rows == want
