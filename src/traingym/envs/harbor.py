"""Harbor task folders (github laude-institute/harbor) as single-turn envs.

A task folder holds instruction.md (the prompt), task.toml (timeouts, env, optional [traingym]
table), environment/requirements.txt (the sandbox image, sandbox/images.py; no Docker),
tests/test.sh (writes /logs/verifier/reward.txt or reward.json) and solution/solve.sh (the
oracle, never in the sandbox). The answer's first fenced block is written to
`[traingym] answer_file` or run as bash in /app; then test.sh runs in the same bwrap sandbox and
the reward file is read on the host (killed, missing or out-of-range [0, 1] scores 0.0).
Trust: task folders are trusted code (pip installs on the host); model code can forge a verdict
inside the tests, so use envs/code_env.py where grading must resist a hostile model.
Not covered: Dockerfiles/docker_image, network, multi-container, agent terminals, GPUs,
multi-step tests, `${VAR}` in [verifier] env. Needs the bwrap backend (fixed /app, /tests, /logs).
"""

from __future__ import annotations

import functools
import json
import math
import os
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from traingym.core.types import Completion, Observation, StepResult
from traingym.envs.code_env import pool_for
from traingym.envs.render import PromptRenderer
from traingym.sandbox import Limits
from traingym.sandbox.base import MiB
from traingym.sandbox.images import ImageSpec

LINKS = (("/app", "/sandbox/app"), ("/tests", "/sandbox/tests"), ("/logs", "/sandbox/logs"))
TRAINGYM_KEYS = ("requirements", "answer_file", "python")
MAX_TESTS_BYTES = 16 * MiB
PREPARE = "mkdir -p /sandbox/app /sandbox/logs/verifier && cd /app && "
# After the agent phase: what it left in /tests and /logs goes, read-only folders included.
CLEAR = ("chmod -R u+w /sandbox/tests /sandbox/logs 2>/dev/null; "
         "rm -rf /sandbox/tests /sandbox/logs && ! [ -e /sandbox/tests ] && ! [ -e /sandbox/logs ]")
READ_REWARD = r'''
import json, os, stat
out = {}
for name in ("reward.json", "reward.txt"):
    p = "/sandbox/logs/verifier/" + name
    try:
        if stat.S_ISREG(os.stat(p).st_mode):
            with open(p, "rb") as f:
                out[name] = f.read(4096).decode("utf-8", "replace")
    except OSError:
        pass
print(json.dumps(out))
'''


class HarborTaskError(ValueError):
    """A task folder that is not a usable Harbor task; the message names the file and the fix."""


@dataclass(frozen=True)
class HarborTask:
    name: str
    path: str
    instruction: str
    image: ImageSpec
    answer_file: str | None  # relative to /app; None: the answer is a bash script
    test_script: str
    tests: tuple[tuple[str, bytes], ...]  # tests/ as (relative path, contents)
    verifier_env: tuple[tuple[str, str], ...]
    verifier_limits: Limits
    agent_limits: Limits


def _seconds(table: dict, where: str, default: float) -> float:
    value = table.get("timeout_sec", default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise HarborTaskError(f"{where}.timeout_sec = {value!r}: give a positive number of "
                              "seconds")
    return float(value)


def check_links(root: Path) -> None:
    """Refuse a symlink anywhere in the task folder that resolves outside it (tests/ copied
    into the sandbox, instruction.md, environment/requirements.txt... would read host files)."""
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath, name)
            if p.is_symlink() and not p.resolve().is_relative_to(root):
                raise HarborTaskError(f"Harbor task {root}: {p.relative_to(root)} is a symlink "
                                      f"to {p.resolve()}, outside the task folder; a task "
                                      "folder must hold its own files (copy them in)")


@functools.lru_cache(maxsize=256)
def load_task(folder: str) -> HarborTask:
    """Read and check one task folder (cached per path)."""
    root = Path(folder).resolve()
    if root.is_dir():
        check_links(root)
    for need in ("instruction.md", "task.toml", "tests/test.sh"):
        if not (root / need).is_file():
            raise HarborTaskError(f"Harbor task {root}: {need} is missing (a task folder holds "
                                  "instruction.md, task.toml, tests/test.sh, environment/, "
                                  "solution/)")
    try:
        config = tomllib.loads((root / "task.toml").read_text())
    except tomllib.TOMLDecodeError as e:
        raise HarborTaskError(f"Harbor task {root}: task.toml is not valid TOML ({e})") from None
    ours = config.get("traingym", {})
    unknown = sorted(set(ours) - set(TRAINGYM_KEYS))
    if unknown:
        raise HarborTaskError(f"Harbor task {root}: task.toml [traingym] has unknown keys "
                              f"{unknown}; it takes {list(TRAINGYM_KEYS)}")
    lock = root / "environment" / "requirements.txt"
    try:
        image = ImageSpec(requirements=tuple(ours.get("requirements", ())),
                          lock=str(lock) if lock.is_file() else None, python=ours.get("python"))
    except ValueError as e:
        raise HarborTaskError(f"Harbor task {root}: its image: {e}") from None
    answer = ours.get("answer_file")
    if answer is not None:
        rel = answer[len("/app/"):] if isinstance(answer, str) and answer.startswith("/app/") \
            else answer
        if not isinstance(rel, str) or not rel or rel.startswith("/") or ".." in Path(rel).parts:
            raise HarborTaskError(f"Harbor task {root}: [traingym] answer_file = {answer!r}: "
                                  "give a file under /app, e.g. '/app/solution.py'")
        answer = rel
    tests, size = [], 0
    for p in sorted((root / "tests").rglob("*")):
        if p.is_file():
            data = p.read_bytes()
            size += len(data)
            tests.append((str(p.relative_to(root / "tests")), data))
    if size > MAX_TESTS_BYTES:
        raise HarborTaskError(f"Harbor task {root}: tests/ holds {size} bytes; at most "
                              f"{MAX_TESTS_BYTES} are copied into each sandbox")
    verifier, agent = config.get("verifier", {}), config.get("agent", {})
    env = verifier.get("env", {})
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise HarborTaskError(f"Harbor task {root}: [verifier] env must map names to strings")
    memory = int(config.get("environment", {}).get("memory_mb", 2048)) * MiB
    verify_s = _seconds(verifier, "[verifier]", 600.0)
    agent_s = _seconds(agent, "[agent]", verify_s)
    return HarborTask(
        name=root.name, path=str(root), instruction=(root / "instruction.md").read_text(),
        image=image, answer_file=answer, test_script=(root / "tests/test.sh").read_text(),
        tests=tuple(tests), verifier_env=tuple(sorted(env.items())),
        verifier_limits=Limits(cpu_s=verify_s, wall_s=verify_s, memory_bytes=memory),
        agent_limits=Limits(cpu_s=agent_s, wall_s=agent_s, memory_bytes=memory))


def task_rows(folder: str | Path) -> list[dict[str, Any]]:
    """One row per task: `folder` is a task, or holds tasks (its subfolders with task.toml)."""
    root = Path(folder)
    if not root.is_dir():
        raise HarborTaskError(f"harbor:{folder}: no such folder (give a Harbor task folder, or "
                              "a folder of them)")
    dirs = [root] if (root / "task.toml").is_file() else sorted(
        p for p in root.iterdir() if (p / "task.toml").is_file())
    if not dirs:
        raise HarborTaskError(f"harbor:{folder}: neither a task folder (task.toml) nor a folder "
                              "of task folders")
    return [{"prompt": t.instruction, "harbor_task": t.path, "id": t.name}
            for t in map(load_task, map(str, dirs))]


_FENCE = re.compile(r"```[\w+.-]*[ \t]*\n(.*?)(?:```|\Z)", re.S)


def answer_text(text: str) -> str:
    """The first fenced code block's body, or the whole text when there is none."""
    m = _FENCE.search(text)
    return (m.group(1) if m else text).strip("\n") + "\n"


@dataclass
class Verdict:
    reward: float
    status: str  # "scored", "killed", "no_reward_file", "bad_reward_file"
    exit_code: int | None
    details: list[str] = field(default_factory=list)

    def info(self) -> dict[str, Any]:
        return {"status": self.status, "exit_code": self.exit_code, "details": self.details}


def judge(files: dict[str, str]) -> tuple[float | None, str]:
    """The reward from the reward files' text (reward.json first, as Harbor reads them)."""
    if "reward.json" in files:
        try:
            value = json.loads(files["reward.json"]).get("reward")
        except (ValueError, AttributeError):
            return None, "reward.json is not a JSON object"
    elif "reward.txt" in files:
        try:
            value = float(files["reward.txt"].strip())
        except ValueError:
            return None, f"reward.txt holds {files['reward.txt'][:40]!r}, not a number"
    else:
        return None, "no reward file in /logs/verifier"
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or not 0.0 <= value <= 1.0:
        return None, f"reward {value!r} is not a number in [0, 1]"
    return float(value), ""


async def run_task(task: HarborTask, answer: str, as_script: bool) -> Verdict:
    """Run `answer` (a script, or the answer file's contents) and then the task's tests, in one
    sandbox session; judge the reward files on the host."""
    details = []
    async with pool_for("bwrap", Limits(), task.image, LINKS).session() as sandbox:
        files = {}
        if as_script:
            r = await sandbox.exec(["bash", "-c", PREPARE + 'exec bash -c "$1"', "agent", answer],
                                   limits=task.agent_limits)
            details.append(f"agent script: exit {r.exit_code}"
                           + (f", killed: {r.killed_reason}" if r.killed_reason else ""))
            r = await sandbox.exec(["bash", "-c", CLEAR], limits=Limits(wall_s=30))
            if r.exit_code != 0:  # e.g. a folder the agent made read-only, to keep its reward
                return Verdict(0.0, "killed", r.exit_code, details + [
                    "the agent phase left /tests or /logs that could not be removed"])
        else:
            files[f"app/{task.answer_file}"] = answer.encode()
        files.update({f"tests/{rel}": data for rel, data in task.tests})
        env = [f"{k}={v}" for k, v in (("TEST_DIR", "/tests"), *task.verifier_env)]
        r = await sandbox.exec(["env", *env, "bash", "-c", PREPARE + 'exec bash -c "$1" '
                                "/tests/test.sh", "verifier", task.test_script],
                               files=files, limits=task.verifier_limits)
        tail = [line[:200] for line in
                (r.stdout + r.stderr).decode("utf-8", "replace").strip().splitlines()[-5:]]
        if r.killed_reason is not None or r.signal is not None:
            return Verdict(0.0, "killed", r.exit_code, details + [
                f"test.sh killed: {r.killed_reason or f'signal {r.signal}'}", *tail])
        out = await sandbox.exec(READ_REWARD, limits=Limits(wall_s=10))
    try:
        reward_files = json.loads(out.stdout[:16384])
    except ValueError:
        reward_files = {}
    reward, why = judge(reward_files if isinstance(reward_files, dict) else {})
    if reward is None:
        status = "no_reward_file" if why.startswith("no reward") else "bad_reward_file"
        return Verdict(0.0, status, r.exit_code, details + [why, *tail])
    return Verdict(reward, "scored", r.exit_code, details + tail)


async def check_task(folder: str | Path) -> Verdict:
    """The oracle: solution/solve.sh as the answer script. A sound task scores 1.0. Needs
    current run resources (`async with RunResources():`)."""
    task = load_task(str(folder))
    solve = Path(task.path) / "solution" / "solve.sh"
    if not solve.is_file():
        raise HarborTaskError(f"Harbor task {task.path}: solution/solve.sh is missing")
    return await run_task(task, solve.read_text(), as_script=True)


class HarborEnv:
    """One single-turn episode of a Harbor task (module docstring)."""

    def __init__(self, example: dict[str, Any], renderer: PromptRenderer):
        if "harbor_task" not in example:
            raise KeyError("task.env = 'harbor' needs rows from task.dataset = 'harbor:<folder>'"
                           f" (each with 'harbor_task'); got keys {sorted(example)}")
        self.example, self.renderer = example, renderer
        self.task = load_task(example["harbor_task"])
        self.verdict: Verdict | None = None

    async def reset(self) -> Observation:
        text = self.renderer.render(self.renderer.messages({"prompt": self.task.instruction}))
        return Observation(self.renderer.encode(text), text)

    async def step(self, completion: Completion) -> StepResult:
        if self.verdict is not None:
            raise RuntimeError("HarborEnv is single-use: reset() once, then step() once")
        text = self.renderer.tokenizer.decode(completion.token_ids, skip_special_tokens=True)
        answer = answer_text(self.renderer.prefill + text)
        self.verdict = await run_task(self.task, answer, as_script=self.task.answer_file is None)
        return StepResult(self.verdict.reward, done=True,
                          info={"harbor_task": self.task.name, **self.verdict.info()})


@dataclass(frozen=True)
class HarborMaker:
    """Picklable env maker `(example, renderer) -> HarborEnv` (task.env = 'harbor')."""

    env_adapter = "harbor"  # its record in envs/adapters.py (not a field)

    def __call__(self, example: dict[str, Any], renderer: PromptRenderer) -> HarborEnv:
        return HarborEnv(example, renderer)
