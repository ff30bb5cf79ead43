"""OpenEnv environments (github meta-pytorch/OpenEnv, HTTP/WebSocket servers) as multi-turn envs.

An episode is one WebSocket session at `/ws` (reset, step, close; the HTTP /reset and /step
build a fresh env per request, so multi-step needs the session). The reset observation is the
first user message, each policy turn is the action's text field, step rewards sum (None: 0.0),
and `done` or rollout.max_turns ends the episode. `task.env = "openenv:<module>:<app>"` starts
a uvicorn server for the run; `"openenv:http://host:port"` reaches a running one. A dead server
or error answer is an OpenEnvError. Needs `traingym[openenv]`.
Not covered: MCP tool sessions, Docker/Hub providers, non-text actions or observations. The
server's max_concurrent_envs must admit a whole collection (prompts_per_step x group_size).
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import subprocess
import sys
import tempfile
import urllib.request
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from traingym.core.procs import NotHealthy, free_port, log_tail, stop_group, wait_healthy_async
from traingym.envs.multi_turn import MultiTurnEnv, Reply
from traingym.envs.render import PromptRenderer
from traingym.envs.resources import current

MAX_MESSAGE = 16 << 20  # bytes of one server message


class OpenEnvError(RuntimeError):
    """The OpenEnv server failed, refused or vanished; the message names the env and the row."""


def _websockets():
    try:
        import websockets
    except ModuleNotFoundError:
        raise ModuleNotFoundError("task.env = 'openenv:...' needs the websockets client: pip "
                                  "install 'traingym[openenv]'") from None
    return websockets


class OpenEnvServer:
    """One OpenEnv server for a run: started here (`app` = 'module:app') or reached (`url`).
    A start that fails (the process exits, or /health stays silent for `startup_s`) stops
    the process it started, and every later `ready()` raises that same error (a reached
    server too): one process per server object, never a second one beside a first that may
    still be starting."""

    def __init__(self, target: str, app_dir: str | None = None, startup_s: float = 120.0):
        self.target, self.app_dir, self.startup_s = target, app_dir, startup_s
        self.remote = target.startswith(("http://", "https://"))
        self.url = target.rstrip("/") if self.remote else None
        self.proc: subprocess.Popen | None = None
        self.log_path: Path | None = None
        self.schema: dict | None = None
        self.failed: OpenEnvError | None = None  # a start that failed, raised to later callers
        self._lock = asyncio.Lock()

    async def ready(self) -> OpenEnvServer:
        async with self._lock:
            if self.failed is not None:
                raise self.failed
            if self.schema is None:
                if not self.remote and self.proc is None:
                    self._spawn()
                try:
                    await self._wait_healthy()
                except OpenEnvError as e:
                    self.failed = e
                    await self.stop()  # a server started here: its process group and log
                    raise
                self.schema = json.loads(await asyncio.to_thread(self._get, "/schema", 10.0))
        return self

    def _spawn(self) -> None:
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        fd, log = tempfile.mkstemp(prefix="traingym-openenv-", suffix=".log")
        self.log_path = Path(log)
        argv = [sys.executable, "-m", "uvicorn", self.target, "--host", "127.0.0.1", "--port",
                str(port), "--app-dir", self.app_dir or os.getcwd()]
        env = dict(os.environ, ENABLE_WEB_INTERFACE="false")
        with os.fdopen(fd, "wb") as out:
            self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out,
                                         stderr=subprocess.STDOUT, env=env,
                                         start_new_session=True)

    def _get(self, path: str, timeout: float) -> bytes:
        with urllib.request.urlopen(self.url + path, timeout=timeout) as r:
            return r.read(MAX_MESSAGE)

    async def _wait_healthy(self) -> None:
        try:
            await wait_healthy_async(self.url + "/health", self.proc, self.startup_s)
        except NotHealthy as e:
            if e.exited is not None:
                raise OpenEnvError(f"OpenEnv server {self.target!r} exited before answering "
                                   f"/health{self.describe()}") from None
            raise OpenEnvError(f"OpenEnv server {self.target!r} did not answer "
                               f"{self.url}/health within {self.startup_s:.0f} s "
                               f"({e.last_error}){self.describe()}") from None

    def describe(self) -> str:
        """The server process's state and last output, for error messages."""
        if self.proc is None:
            return ""
        code = self.proc.poll()
        state = "still running" if code is None else f"exited with code {code}"
        tail = log_tail(self.log_path, lines=8, missing="")
        tail = "; its last output:\n  " + "\n  ".join(tail.splitlines()) if tail else ""
        return f" (the server process {self.proc.pid} {state}{tail})"

    async def stop(self) -> None:
        """Stop the server's process group (SIGTERM, then SIGKILL after 10 s; at most 20 s in
        all, in a worker thread, so the event loop keeps running) and remove its log."""
        await asyncio.to_thread(stop_group, self.proc, 10.0, 10.0)
        if self.log_path is not None:
            self.log_path.unlink(missing_ok=True)


def _string_fields(schema: dict) -> list[str]:
    props = schema.get("properties", {})
    return [k for k, v in props.items() if k != "metadata" and v.get("type") == "string"]


def _close_later(loop: asyncio.AbstractEventLoop, ws) -> None:
    """An episode stopped short (max_turns) never says done: the runner closes its session in
    `close`; an episode driven elsewhere, when the env object goes away."""
    if not loop.is_closed():
        loop.call_soon_threadsafe(lambda: loop.create_task(ws.close()))


class OpenEnvEnv(MultiTurnEnv):
    """One episode: one WebSocket session of the run's OpenEnv server (module docstring)."""

    def __init__(self, example: dict[str, Any], renderer: PromptRenderer, maker: OpenEnvMaker):
        super().__init__(example, renderer)
        self.maker = maker
        self.server: OpenEnvServer | None = None
        self.ws = None
        self.steps = 0
        self._first = ""

    def _where(self) -> str:
        row = {k: v for k, v in self.example.items() if k != "prompt"}
        prompt = self.example.get("prompt")
        return (f"OpenEnv env {self.maker.server!r} ({self.server.url if self.server else '-'}), "
                f"row {row!r:.200} (prompt {prompt!r:.80}), step {self.steps}")

    async def reset(self):
        server = current().keep_on_loop(("openenv.server", self.maker.server, self.maker.app_dir),
                                        self.maker.new_server, OpenEnvServer.stop)
        self.server = await server.ready()
        ws_mod = _websockets()
        url = "ws" + self.server.url[len("http"):] + "/ws"
        try:
            self.ws = await ws_mod.connect(url, max_size=MAX_MESSAGE, open_timeout=30)
        except (OSError, ws_mod.exceptions.WebSocketException, asyncio.TimeoutError) as e:
            raise OpenEnvError(f"{self._where()}: cannot open the session ({e})"
                               f"{self.server.describe()}") from None
        weakref.finalize(self, _close_later, asyncio.get_running_loop(), self.ws)
        data = {"seed": self.example.get("seed"), **(self.example.get("options") or {})}
        obs = await self._call({"type": "reset", "data": {k: v for k, v in data.items()
                                                           if v is not None}})
        self._first = self._text(obs)
        return await super().reset()

    async def close(self) -> None:
        """End the session (runner: when the collection ends; also after `done`)."""
        if self.ws is not None:
            await self.ws.close()

    def first_messages(self) -> list[dict[str, Any]]:
        prompt = self.example.get("prompt")
        content = self._first
        if isinstance(prompt, str) and prompt:
            content = f"{prompt}\n\n{content}"
        return self.renderer.messages({"prompt": content})

    async def respond(self, text: str) -> Reply:
        self.steps += 1
        obs = await self._call({"type": "step", "data": {self._action_field(): text}})
        reward = obs.get("reward")
        reward = 0.0 if reward is None else reward
        if isinstance(reward, bool) or not isinstance(reward, (int, float)) \
                or not math.isfinite(reward):
            raise OpenEnvError(f"{self._where()}: the server returned reward {reward!r}; it "
                               "must be a finite number or null")
        if obs.get("done"):
            await self.ws.close()
            return Reply(reward=float(reward), done=True)
        return Reply([{"role": "user", "content": self._text(obs)}], float(reward))

    async def _call(self, message: dict) -> dict:
        ws_mod = _websockets()
        try:
            await self.ws.send(json.dumps(message))
            raw = await asyncio.wait_for(self.ws.recv(), self.maker.step_timeout_s)
        except ws_mod.exceptions.ConnectionClosed as e:
            raw = await self._last_words()  # a refusal (no free session) comes, then the close
            if raw is None:
                await asyncio.sleep(0.2)  # a dying server: let its exit code show
                raise OpenEnvError(f"{self._where()}: the server closed the session during "
                                   f"{message['type']} ({e}){self.server.describe()}") from None
        except asyncio.TimeoutError:
            raise OpenEnvError(f"{self._where()}: no answer to {message['type']} within "
                               f"{self.maker.step_timeout_s:.0f} s{self.server.describe()}") \
                from None
        try:
            reply = json.loads(raw)
        except ValueError:
            raise OpenEnvError(f"{self._where()}: the server answered {message['type']} with "
                               f"non-JSON {raw[:200]!r}") from None
        if reply.get("type") == "error":
            err = reply.get("data", {})
            raise OpenEnvError(f"{self._where()}: the server refused {message['type']}: "
                               f"{err.get('code')}: {str(err.get('message'))[:300]}"
                               f"{str(err.get('errors', ''))[:300]}"
                               + (" (raise the server's max_concurrent_envs to at least "
                                  "prompts_per_step x group_size)"
                                  if err.get("code") == "CAPACITY_REACHED" else ""))
        if reply.get("type") != "observation" or not isinstance(reply.get("data"), dict):
            raise OpenEnvError(f"{self._where()}: unexpected answer to {message['type']}: "
                               f"{str(reply)[:200]}")
        return reply["data"]

    async def _last_words(self):
        """A message the server sent before it closed the session, if any."""
        ws_mod = _websockets()
        try:
            return await asyncio.wait_for(self.ws.recv(), 0.5)
        except (ws_mod.exceptions.ConnectionClosed, asyncio.TimeoutError):
            return None  # closed with nothing buffered

    def _action_field(self) -> str:
        if self.maker.action_field:
            return self.maker.action_field
        action = self.server.schema.get("action", {})
        fields = _string_fields(action)
        if len(fields) != 1:
            raise OpenEnvError(f"{self._where()}: its action has string fields {fields} (all "
                               f"fields: {sorted(action.get('properties', {}))}); name the one "
                               "that takes the policy's text: OpenEnvMaker(server, "
                               "action_field=...)")
        return fields[0]

    def _text(self, data: dict) -> str:
        obs = {k: v for k, v in (data.get("observation") or {}).items() if k != "metadata"}
        field = self.maker.observation_field
        if field is not None:
            if field not in obs:
                raise OpenEnvError(f"{self._where()}: the observation has no field {field!r} "
                                   f"(fields: {sorted(obs)})")
            value = obs[field]
            return value if isinstance(value, str) else json.dumps(value)
        strings = [k for k, v in obs.items() if isinstance(v, str)]
        return obs[strings[0]] if len(strings) == 1 else json.dumps(obs, sort_keys=True)


@dataclass(frozen=True)
class OpenEnvMaker:
    """Picklable env maker `(example, renderer) -> OpenEnvEnv` for one OpenEnv server:
    `server` is 'module:app' (started here) or 'http(s)://host:port' (reached)."""

    server: str
    action_field: str | None = None  # None: the action schema's only string field
    observation_field: str | None = None  # None: the only string field, else all as JSON
    app_dir: str | None = None  # where 'module' is imported from; None: the current folder
    startup_s: float = 120.0  # /health must answer within this
    step_timeout_s: float = 300.0  # each reset/step must be answered within this
    env_adapter = "openenv"  # its record in envs/adapters.py (not a field)

    def __post_init__(self):
        s = self.server
        if not s.startswith(("http://", "https://")) and (
                s.count(":") != 1 or not all(s.split(":"))):
            raise ValueError(f"OpenEnv server {s!r}: give 'module:app' (an ASGI app made with "
                             "openenv's create_app, started here) or 'http://host:port' (a "
                             "running server)")

    def new_server(self) -> OpenEnvServer:
        return OpenEnvServer(self.server, self.app_dir, self.startup_s)

    def __call__(self, example: dict[str, Any], renderer: PromptRenderer) -> OpenEnvEnv:
        return OpenEnvEnv(example, renderer, self)


def from_task(server: str, env_args: dict[str, Any]) -> OpenEnvMaker:
    """The maker for task.env = 'openenv:<server>' and task.env_args (the maker's other
    fields); its factory in envs/adapters.py."""
    from traingym.core.errors import ConfigError  # heavy: pydantic

    keys = [f for f in OpenEnvMaker.__dataclass_fields__ if f != "server"]
    unknown = sorted(set(env_args) - set(keys))
    if unknown:
        raise ConfigError(f"task.env_args {unknown} for an OpenEnv env: it takes {keys}")
    return OpenEnvMaker(server, **env_args)
