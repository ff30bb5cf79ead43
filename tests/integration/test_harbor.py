"""A Harbor-format task folder (examples/harbor/add-numbers) through the adapter
(envs/harbor.py): its tests run in a bwrap sandbox whose image holds the task's requirements
(pytest), the verdict is read on the host; the oracle scores 1.0, wrong or forged answers 0.0;
a 2-step tiny training run and an evaluation (issue 16 acceptance 3, Harbor part)."""

import asyncio
import json
from pathlib import Path

import pytest
from prereq import require_sandbox

import traingym

TASK = Path(__file__).resolve().parents[2] / "examples" / "harbor" / "add-numbers"


@pytest.fixture(autouse=True)
def _bwrap():
    require_sandbox("bwrap")


def _run(coro):
    from traingym.envs.resources import RunResources

    async def main():
        async with RunResources():
            return await coro

    return asyncio.run(main())


def test_oracle_passes_wrong_and_forged_answers_fail():
    from traingym.envs.harbor import check_task, load_task, run_task

    task = load_task(str(TASK))
    assert task.answer_file == "solution.py" and task.image.requirements == ("pytest",)
    assert {rel for rel, _ in task.tests} == {"test.sh", "test_outputs.py"}

    async def all_cases():
        oracle = await check_task(TASK)
        right = await run_task(task, "def add(a, b):\n    return b + a\n", as_script=False)
        wrong = await run_task(task, "def add(a, b):\n    return a - b\n", as_script=False)
        # the agent phase sees no tests, and a reward file it leaves is emptied before test.sh
        forged = await run_task(task, "if [ -e /tests/test.sh ]; then exit 7; fi\n"
                                      "mkdir -p /logs/verifier && echo 1 > "
                                      "/logs/verifier/reward.txt\n", as_script=True)
        # a solution that tampers with the test script's file while it runs changes nothing
        tamper = await run_task(task, "import os\nopen('/tests/test.sh', 'a').write("
                                      "'\\necho 1 > /logs/verifier/reward.txt\\n')\n"
                                      "def add(a, b):\n    return 0\n", as_script=False)
        # ... also from a folder the agent made read-only
        locked = await run_task(task, "mkdir -p /logs/verifier && echo '{\"reward\": 1}' > "
                                      "/logs/verifier/reward.json && chmod 555 /logs/verifier "
                                      "/logs\n", as_script=True)
        return oracle, right, wrong, forged, tamper, locked

    oracle, right, wrong, forged, tamper, locked = _run(all_cases())
    assert locked.reward == 0.0 and "agent script: exit 0" in locked.details, locked
    assert (oracle.reward, oracle.status) == (1.0, "scored"), oracle
    assert right.reward == 1.0, right
    assert (wrong.reward, wrong.status) == (0.0, "scored"), wrong
    assert any("failed" in d for d in wrong.details), wrong
    assert forged.reward == 0.0 and "agent script: exit 0" in forged.details, forged
    assert tamper.reward == 0.0, tamper


def test_harbor_task_trains_and_evaluates(tmp_path):
    cfg = traingym.build_config("tiny", overrides={
        "steps": 2, "eval": {"num_prompts": 1},
        "rollout": {"prompts_per_step": 2, "group_size": 2, "max_new_tokens": 12},
        "task": {"env": "harbor", "dataset": f"harbor:{TASK}", "eval_dataset": f"harbor:{TASK}",
                 "prefill": "```python\ndef add(a, b):\n"}})
    run = tmp_path / "run"
    result = traingym.train(cfg, run_dir=run, progress=False)
    events = [json.loads(x) for x in (run / "events.jsonl").read_text().splitlines()]
    assert [e["step"] for e in events] == [1, 2]
    samples = [json.loads(x) for x in (run / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == 2 * 2 * 2
    for s in samples:
        assert "Write a Python function `add(a, b)`" in s["prompt"]
        (info,) = s["env_info"]
        assert info["harbor_task"] == "add-numbers"
        # test.sh writes reward.txt whatever pytest says: every answer is scored
        assert info["status"] == "scored", info
        assert s["reward"] in (0.0, 1.0)
    assert "after" in result.eval
    # one task folder: the evaluation measures the training task on purpose
    res = traingym.evaluate(run, allow_overlap=True)
    assert res.summary["num_prompts"] == 1
    assert res.records[0]["example"]["id"] == "add-numbers"


def test_bad_task_folders_are_named(tmp_path):
    from traingym.envs.harbor import HarborTaskError, load_task, task_rows

    with pytest.raises(traingym.ConfigError, match="task.dataset = 'harbor:<folder>'"):
        traingym.train(traingym.build_config("tiny", overrides={"task": {"env": "harbor"}}),
                       run_dir=tmp_path / "r", progress=False)

    with pytest.raises(HarborTaskError, match="neither a task folder"):
        task_rows(tmp_path)
    bad = tmp_path / "t"
    (bad / "tests").mkdir(parents=True)
    (bad / "instruction.md").write_text("Do it.")
    (bad / "task.toml").write_text("[traingym]\nanswer = 'x.py'\n")
    with pytest.raises(HarborTaskError, match="tests/test.sh is missing"):
        load_task(str(bad))
    (bad / "tests" / "test.sh").write_text("exit 0\n")
    with pytest.raises(HarborTaskError, match=r"unknown keys \['answer'\]"):
        load_task(str(bad))
    (bad / "task.toml").write_text("[traingym]\nanswer_file = '/etc/passwd'\n")
    with pytest.raises(HarborTaskError, match="give a file under /app"):
        load_task(str(bad))
    (bad / "task.toml").write_text("[verifier]\ntimeout_sec = -1\n")
    with pytest.raises(HarborTaskError, match="timeout_sec = -1"):
        load_task(str(bad))


def test_sandbox_links_are_checked():
    from traingym.sandbox.bwrap import BwrapSandbox, check_links

    assert check_links({"/app": "/sandbox/app"}) == (("/app", "/sandbox/app"),)
    with pytest.raises(ValueError, match="new top-level path"):
        check_links({"/usr": "/sandbox/x"})
    with pytest.raises(ValueError, match="new top-level path"):
        check_links({"/a/b": "/sandbox/x"})
    with pytest.raises(ValueError, match="the target must lie in"):
        check_links({"/app": "/etc"})
    for escape in ("/sandbox/../etc", "/image/../../usr", "sandbox/x", "/tmp/a/../../etc"):
        with pytest.raises(ValueError, match="the target must lie in"):
            check_links({"/app": escape})
    assert check_links({"/app/": "/sandbox/a/../b"}) == (("/app", "/sandbox/b"),)
    with pytest.raises(ValueError, match="new top-level path"):
        check_links({"/opt": "/sandbox/x"}, points={"/opt/python/lib"})  # holds a mount point
    with pytest.raises(ValueError, match="new top-level path"):
        check_links({"/x/..//usr": "/sandbox/x"})
    from traingym.sandbox.images import get_image

    top = "/" + get_image(None).interpreter.prefix.split("/")[1]
    with pytest.raises(ValueError, match="installation|new top-level path"):
        BwrapSandbox(links={top: "/sandbox/x"})  # refused before anything starts


def test_task_image_and_limits_come_from_the_folder(tmp_path):
    """environment/requirements.txt is the image's lock file, [traingym] requirements its list;
    the timeouts and memory of task.toml become the sandbox limits; no answer_file: a script."""
    from traingym.envs.harbor import load_task, task_rows

    task_dir = tmp_path / "tasks" / "t1"
    (task_dir / "tests").mkdir(parents=True)
    (task_dir / "environment").mkdir()
    (task_dir / "instruction.md").write_text("Make /app/out.txt say hi.")
    (task_dir / "tests" / "test.sh").write_text("grep -q hi /app/out.txt\n")
    (task_dir / "environment" / "requirements.txt").write_text("numpy==2.3.0\n")
    (task_dir / "task.toml").write_text(
        "[verifier]\ntimeout_sec = 12.5\n[agent]\ntimeout_sec = 7\n"
        "[environment]\nmemory_mb = 300\n[traingym]\nrequirements = ['pytest']\n")
    task = load_task(str(task_dir))
    assert task.image.lock == str(task_dir / "environment" / "requirements.txt")
    assert task.image.requirements == ("pytest",) and task.answer_file is None
    assert (task.verifier_limits.wall_s, task.agent_limits.wall_s) == (12.5, 7.0)
    assert task.verifier_limits.memory_bytes == 300 << 20
    assert [r["id"] for r in task_rows(tmp_path / "tasks")] == ["t1"]


def test_symlinks_out_of_the_task_folder_are_refused(tmp_path):
    import shutil

    from traingym.envs.harbor import HarborTaskError, load_task

    outside = tmp_path / "secret.txt"
    outside.write_text("host secret")
    for i, rel in enumerate(("tests/secret.txt", "instruction.md",
                             "environment/requirements.txt", "solution")):
        task = tmp_path / f"t{i}"
        shutil.copytree(TASK, task)
        target = task / rel
        if target.is_dir():
            shutil.rmtree(target)
        else:
            target.unlink(missing_ok=True)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.symlink_to(outside if rel != "solution" else tmp_path)
        with pytest.raises(HarborTaskError, match=f"{rel} is a symlink to .*outside the task"):
            load_task(str(task))
    inside = tmp_path / "ok"
    shutil.copytree(TASK, inside)
    (inside / "tests" / "again.py").symlink_to(inside / "tests" / "test_outputs.py")
    assert "again.py" in {rel for rel, _ in load_task(str(inside)).tests}


def test_ray_sandbox_workers_refuse_harbor_tasks_as_images():
    """Harbor's pool is code_env.pool_for with links: the same refusal as an image."""
    from traingym.envs.code_env import GRADING_LIMITS, pool_for
    from traingym.envs.harbor import LINKS
    from traingym.envs.resources import RunResources

    class Workers:
        def pool(self, backend, limits):
            return "remote pool"

    async def main():
        async with RunResources(sandboxes=Workers()):
            assert pool_for("bwrap", GRADING_LIMITS) == "remote pool"
            for kwargs in ({"links": LINKS}, {"image": {"requirements": ["pytest"]}}):
                with pytest.raises(ValueError, match="images and links .* not supported on "
                                                     "Ray sandbox workers"):
                    pool_for("bwrap", GRADING_LIMITS, **kwargs)

    asyncio.run(main())
