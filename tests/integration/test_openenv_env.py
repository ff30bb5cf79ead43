"""An OpenEnv environment through the adapter (envs/openenv_env.py): the echo env that the
`openenv` package ships as its template (made offline by `openenv init`), served by openenv's
own server (create_app, uvicorn) in processes the adapter starts on 127.0.0.1: a 2-step tiny
training run and an evaluation reach one at its URL; a 'module:app' server started inside a
run's resources maps reset/step/reward and is gone when they close; a server that dies
mid-episode is an error naming the env and the row (issue 16 acceptance 3, OpenEnv part)."""

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from prereq import require

import traingym

APP = "echo_env.server.app:app"


@pytest.fixture(scope="module")
def echo_env(tmp_path_factory):
    """The package's template env, made by its CLI; max_concurrent_envs raised as the template's
    comment says, so a collection's episodes (prompts x group size) each get a session."""
    require("openenv", "openenv (pip install 'traingym[openenv]')")
    require("websockets", "websockets (pip install 'traingym[openenv]')")
    root = tmp_path_factory.mktemp("openenv")
    cli = Path(sys.executable).parent / "openenv"
    env = dict(os.environ, PATH=f"{cli.parent}:/usr/bin:/bin")  # no uv: no lock file attempt
    subprocess.run([str(cli), "init", "echo_env", "--output-dir", str(root)], check=True,
                   capture_output=True, env=env, timeout=300)
    app = root / "echo_env" / "server" / "app.py"
    text = app.read_text()
    assert "max_concurrent_envs=1," in text
    app.write_text(text.replace("max_concurrent_envs=1,", "max_concurrent_envs=64,"))
    return root


@pytest.fixture(scope="module")
def echo_url(echo_env):
    """One echo server for the training test, started and stopped by the adapter's
    OpenEnvServer (each start imports openenv's server stack: seconds)."""
    from traingym.envs.openenv_env import OpenEnvServer

    server = OpenEnvServer(APP, app_dir=str(echo_env))
    asyncio.run(server.ready())
    yield server.url
    asyncio.run(server.stop())
    assert server.proc.poll() is not None and _servers(str(echo_env)) == []


def _servers(marker: str) -> list[int]:
    """Pids of live uvicorn processes serving from the folder `marker`."""
    pids = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                cmd = (p / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"uvicorn" in cmd and marker.encode() in cmd:
                pids.append(int(p.name))
    return pids


def test_openenv_echo_trains_and_evaluates(echo_url, tmp_path):
    rows = [{"prompt": f"Say something, {i}.", "seed": i} for i in range(12)]
    data, held = tmp_path / "episodes.jsonl", tmp_path / "held.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows[:8]))
    held.write_text("".join(json.dumps(r) + "\n" for r in rows[8:]))
    cfg = traingym.build_config("tiny", overrides={
        "steps": 2, "rollout": {"max_turns": 2}, "eval": {"num_prompts": 4},
        "task": {"env": f"openenv:{echo_url}", "env_args": {"action_field": "message"},
                 "prefill": "", "dataset": str(data), "eval_dataset": str(held)}})
    run = tmp_path / "run"
    result = traingym.train(cfg, run_dir=run, progress=False)
    events = [json.loads(x) for x in (run / "events.jsonl").read_text().splitlines()]
    assert [e["step"] for e in events] == [1, 2]
    samples = [json.loads(x) for x in (run / "samples.jsonl").read_text().splitlines()]
    for s in samples:
        # the reset observation follows the row's prompt; the echo env never says done, so
        # max_turns ends every episode after 2 turns, and it echoes the first turn back
        assert "Say something" in s["prompt"] and "Echo Env environment ready!" in s["prompt"]
        assert s["turns"] == 2
        # its reward: min(0.1 * len(message), 1) per step, summed over the 2 steps
        assert 0.0 <= s["reward"] <= 2.0
    assert any(s["reward"] > 0 for s in samples)
    assert "after" in result.eval
    res = traingym.evaluate(run)
    assert res.summary["num_prompts"] == 4
    assert {r["example"]["seed"] for r in res.records} == {8, 9, 10, 11}


ONE_SESSION = '''
from openenv.core.env_server.http_server import create_app
from echo_env.models import EchoAction, EchoObservation
from echo_env.server.echo_env_environment import EchoEnvironment

app = create_app(EchoEnvironment, EchoAction, EchoObservation, env_name="echo_one",
                 max_concurrent_envs=1)
'''


def test_adapter_starts_maps_and_stops_a_server(echo_env):
    """'module:app': the adapter starts the server, maps reset/step, names a refused session
    (no free one) with the fix, frees the session of an episode the runner stopped (max_turns:
    never done) so that the next episode gets the server's only session, and the run's
    resources stop the server when they close."""
    from traingym.envs.openenv_env import OpenEnvError, OpenEnvMaker
    from traingym.envs.render import PromptRenderer
    from traingym.envs.resources import RunResources
    from traingym.models.loader import tiny_tokenizer
    from traingym.core.types import Completion

    (echo_env / "echo_one.py").write_text(ONE_SESSION)
    tok = tiny_tokenizer()
    maker = OpenEnvMaker("echo_one:app", app_dir=str(echo_env))

    def turn(context, text):
        ids = list(tok(text, add_special_tokens=False)["input_ids"])
        return Completion(tuple(context), ids, [0.0] * len(ids), "length", 0)

    async def episode(seed):
        env = maker({"prompt": "", "seed": seed}, PromptRenderer(tok, ""))
        obs = await env.reset()
        assert "Echo Env environment ready!" in obs.text
        r1 = await env.step(turn(obs.prompt_ids, "hello"))
        assert not r1.done and r1.reward == pytest.approx(0.5)  # len('hello') * 0.1
        assert "hello" in r1.next_observation.text
        if seed == 1:  # while this episode holds the server's only session
            other = maker({"prompt": "", "seed": 9}, PromptRenderer(tok, ""))
            with pytest.raises(OpenEnvError, match="CAPACITY_REACHED.*max_concurrent_envs"):
                await other.reset()
        return env.server.proc.pid  # the env is dropped here, its episode unfinished

    async def play():
        async with RunResources():
            pid = await episode(1)
            await asyncio.sleep(0.5)  # the dropped env's session closes on the loop
            assert await episode(2) == pid  # one server; its one session was free again
        return pid

    pid = asyncio.run(play())
    assert not Path(f"/proc/{pid}").exists()  # the run's resources stopped (and reaped) it


DYING = '''
import os
from openenv.core.env_server.http_server import create_app
from echo_env.models import EchoAction, EchoObservation
from echo_env.server.echo_env_environment import EchoEnvironment


class Dying(EchoEnvironment):
    def step(self, action):
        os._exit(3)  # the server process dies in the middle of the episode


app = create_app(Dying, EchoAction, EchoObservation, env_name="dying",
                 max_concurrent_envs=4)
'''


def test_server_dying_mid_episode_names_env_and_row(echo_env):
    from traingym.envs.openenv_env import OpenEnvError, OpenEnvMaker
    from traingym.envs.render import PromptRenderer
    from traingym.envs.resources import RunResources
    from traingym.models.loader import tiny_tokenizer
    from traingym.core.types import Completion

    (echo_env / "dying_env.py").write_text(DYING)
    tok = tiny_tokenizer()
    env = OpenEnvMaker("dying_env:app", app_dir=str(echo_env))(
        {"prompt": "", "seed": 7, "id": "row-seven"}, PromptRenderer(tok, ""))

    async def play():
        async with RunResources():
            obs = await env.reset()
            ids = list(tok("hi", add_special_tokens=False)["input_ids"])
            with pytest.raises(OpenEnvError) as info:
                await env.step(Completion(tuple(obs.prompt_ids), ids, [0.0] * len(ids),
                                          "length", 0))
            return str(info.value), env.server.proc

    message, proc = asyncio.run(play())
    assert "dying_env:app" in message and "row-seven" in message and "'seed': 7" in message
    assert "closed the session during step" in message and "exited with code 3" in message
    assert proc.poll() == 3


def test_bad_openenv_settings_are_named(tmp_path):
    from traingym.envs.openenv_env import OpenEnvMaker

    with pytest.raises(ValueError, match="give 'module:app'"):
        OpenEnvMaker("not-an-app")
    with pytest.raises(traingym.ConfigError, match="needs episodes"):
        traingym.train(traingym.build_config("tiny", overrides={"task": {
            "env": "openenv:http://127.0.0.1:9"}}), run_dir=tmp_path / "r0", progress=False)
    cfg = traingym.build_config("tiny", overrides={"task": {
        "env": "openenv:http://127.0.0.1:9", "env_args": {"action": "message"},
        "dataset": str(tmp_path / "rows.jsonl")}})
    (tmp_path / "rows.jsonl").write_text('{"prompt": ""}\n')
    with pytest.raises(traingym.ConfigError, match=r"env_args \['action'\].*'action_field'"):
        traingym.train(cfg, run_dir=tmp_path / "r", progress=False)


NEVER_HEALTHY = '''
async def app(scope, receive, send):  # a plain ASGI app whose /health never says yes
    if scope["type"] != "http":
        return
    await send({"type": "http.response.start", "status": 503, "headers": []})
    await send({"type": "http.response.body", "body": b"starting"})
'''


def test_a_server_that_never_gets_healthy_is_started_once_and_stopped(tmp_path, monkeypatch):
    """Two episodes wait for a server whose /health never answers 2xx within startup_s: one
    process is started, both get the same error naming the timeout, and afterwards no
    process of it is left and its log is gone (a later ready() does not start another)."""
    require("uvicorn", "uvicorn (pip install 'traingym[openenv]')")
    from traingym.envs import openenv_env
    from traingym.envs.openenv_env import OpenEnvError, OpenEnvServer

    (tmp_path / "never_healthy.py").write_text(NEVER_HEALTHY)
    started = []
    real_popen = openenv_env.subprocess.Popen

    def popen(*args, **kwargs):
        started.append(real_popen(*args, **kwargs))
        return started[-1]

    monkeypatch.setattr(openenv_env.subprocess, "Popen", popen)
    server = OpenEnvServer("never_healthy:app", app_dir=str(tmp_path), startup_s=3.0)

    async def two_waiters():
        return await asyncio.gather(server.ready(), server.ready(), return_exceptions=True)

    errors = asyncio.run(two_waiters())
    assert all(isinstance(e, OpenEnvError) for e in errors), errors
    assert errors[0] is errors[1]
    assert "did not answer" in str(errors[0]) and "within 3 s" in str(errors[0])
    with pytest.raises(OpenEnvError, match="did not answer"):
        asyncio.run(server.ready())
    assert len(started) == 1
    assert started[0].poll() is not None and _servers(str(tmp_path)) == []
    assert not server.log_path.exists()
