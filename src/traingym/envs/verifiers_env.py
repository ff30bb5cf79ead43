"""`verifiers` environments (classic API, versions 0.2 and 0.3) as traingym envs.

`task.env = "verifiers:<env_id>"` calls `vf.load_environment(env_id, **task.env_args)`; without
task.dataset the rows are the environment's own (its eval_dataset, or the last
eval.num_prompts rows, held out). verifiers' own rollout loop runs with a `Client` that hands
each model call to traingym, so its stop conditions, env_response, tools and state apply; its
rubric scores the final state, and a reward function that raises or returns a non-number stops
the run (verifiers would score 0). Per-function rewards go to env_info.
Not covered: verifiers 0.4 (refused), group reward functions and advantage rubrics (refused),
weight-0 metrics, malformed tool calls; an episode cut by rollout.max_context_tokens gets no
rubric score, so a max_turns above rollout.max_turns is refused at load (check_turns).
"""

from __future__ import annotations

import asyncio
import inspect
import json
import math
import time
import weakref
from dataclasses import dataclass, field
from typing import Any

from traingym.core.toolcalls import HermesParser, ToolCall
from traingym.core.types import Observation
from traingym.envs.multi_turn import MultiTurnEnv, Reply
from traingym.envs.render import PromptRenderer
from traingym.envs.tools import tools_system_prompt
from traingym.envs.transcript import Transcript

_ENVS: dict[tuple[str, str], Any] = {}  # (env_id, args as JSON) -> loaded environment


def vf_module():
    """`import verifiers as vf` with the classic API, or an error naming the fix."""
    try:
        import verifiers as vf
    except ModuleNotFoundError:
        raise ModuleNotFoundError("task.env = 'verifiers:...' needs verifiers: pip install "
                                  "'traingym[verifiers]'") from None
    try:
        vf.Environment  # noqa: B018 (0.3 loads the classic API on first touch)
    except AttributeError:
        raise ModuleNotFoundError(f"verifiers {getattr(vf, '__version__', '?')} has no classic "
                                  "API (vf.Environment, vf.load_environment); traingym's adapter "
                                  "covers verifiers 0.2-0.3: pip install 'verifiers>=0.2,<0.4'"
                                  ) from None
    return vf


def load_env(env_id: str, env_args: dict[str, Any] | None = None):
    """The environment `vf.load_environment(env_id, **env_args)` gives, once per process."""
    key = (env_id, json.dumps(env_args or {}, sort_keys=True, default=str))
    if key not in _ENVS:
        vf = vf_module()
        try:
            env = vf.load_environment(env_id, **(env_args or {}))
        except ValueError as e:
            raise ValueError(f"task.env 'verifiers:{env_id}': {e} (pip install its package, or "
                             "put a module named like it with a load_environment() on "
                             "PYTHONPATH)") from e
        check_rubric(env, env_id)
        _ENVS[key] = env
    return _ENVS[key]


def check_turns(env, name: str, max_turns: int) -> None:
    """Refuse an environment whose own turn limit is unlimited or above traingym's
    rollout.max_turns: its episodes would be cut before the rubric scores them (reward 0)."""
    limit = getattr(env, "max_turns", None)
    if not isinstance(limit, int):
        return  # an Environment without a turn limit of its own: its loop decides
    if limit <= 0:
        raise ValueError(f"verifiers env {name!r} has max_turns={limit} (unlimited), so an "
                         f"episode can outlast rollout.max_turns={max_turns} and would be cut "
                         "before its rubric scores it (reward 0): give the environment a "
                         f"max_turns of at most {max_turns} (its load_environment argument, "
                         "task.env_args)")
    if limit > max_turns:
        raise ValueError(f"verifiers env {name!r} has max_turns={limit} but "
                         f"rollout.max_turns={max_turns}: traingym would cut longer episodes "
                         "before the rubric scores them (reward 0): set rollout.max_turns = "
                         f"{limit} (or lower the environment's max_turns)")


def rubrics(rubric) -> list:
    """The rubric, or the rubrics of a RubricGroup (nested groups flattened)."""
    inner = getattr(rubric, "rubrics", None)
    if inner is None:
        return [rubric]
    return [r for sub in inner for r in rubrics(sub)]


def check_rubric(env, name: str) -> None:
    """Refuse what the adapter does not cover: group reward functions, advantage rubrics."""
    if not any(w != 0 for r in rubrics(env.rubric) for w in r.weights):
        raise ValueError(f"verifiers env {name!r}: its rubric has no reward function with a "
                         "non-zero weight, so every episode would score 0")
    for r in rubrics(env.rubric):
        if getattr(r, "has_advantages", False):
            raise ValueError(f"verifiers env {name!r}: rubric {type(r).__name__} computes its "
                             "own advantages, which traingym's algorithms replace: not covered")
        for func, w in zip(r.funcs, r.weights):
            if w != 0 and r._is_group_func(func):
                raise ValueError(f"verifiers env {name!r}: reward function "
                                 f"{func.__name__} scores a group (plural arguments); not "
                                 "covered: give it per-sample arguments, or write it as "
                                 "task.group_reward")


def _plain(row: dict[str, Any]) -> dict[str, Any]:
    """A dataset row with the None fields that Arrow adds to chat messages removed."""
    out = dict(row)
    if isinstance(out.get("prompt"), list):
        out["prompt"] = [{k: v for k, v in m.items() if v is not None} for m in out["prompt"]]
    return out


def env_rows(env, num_heldout: int) -> tuple[list[dict], list[dict]]:
    """(training rows, held-out rows) from the environment's datasets (module docstring)."""
    train = [_plain(r) for r in env.get_dataset()] if env.dataset_source or env.dataset else []
    if env.eval_dataset is not None or env.eval_dataset_source is not None:
        return train, [_plain(r) for r in env.get_eval_dataset()][:num_heldout]
    if len(train) <= num_heldout:
        raise ValueError(f"the verifiers env has {len(train)} rows and no eval_dataset; "
                         f"eval.num_prompts={num_heldout} would leave none to train on: lower "
                         "eval.num_prompts or give task.eval_dataset")
    return train[:-num_heldout], train[-num_heldout:]


def _text(content) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(p.get("text", "") if isinstance(p, dict) else getattr(p, "text", "") or ""
                   for p in content)


def _dict(message) -> dict[str, Any]:
    """A verifiers message (pydantic or dict) as a chat-template message."""
    m = message.model_dump() if hasattr(message, "model_dump") else dict(message)
    out = {"role": m["role"], "content": _text(m.get("content"))}
    if m.get("tool_calls"):
        out["tool_calls"] = [{"type": "function", "function": {
            "name": c["name"], "arguments": c["arguments"]}} for c in m["tool_calls"]]
    if m.get("tool_call_id"):
        out["tool_call_id"] = m["tool_call_id"]
    return out


def _schema(tool) -> dict:
    t = tool.model_dump() if hasattr(tool, "model_dump") else dict(tool)
    return {"type": "function", "function": {"name": t["name"], "description":
                                             t.get("description") or "",
                                             "parameters": t.get("parameters") or {}}}


def policy_client(channel: _Channel):
    """A verifiers Client whose model is the traingym policy: each call is handed over the
    channel and answered by the episode's next policy turn."""
    from verifiers.clients.client import Client

    class PolicyClient(Client):
        def setup_client(self, config):
            raise TypeError("the policy client is built around a channel, not a config")

        async def to_native_tool(self, tool):
            return tool

        async def to_native_prompt(self, messages):
            return messages, {}

        async def get_native_response(self, prompt, model, sampling_args, tools=None, **kw):
            return await self.client.ask(prompt, tools)

        async def raise_from_native_response(self, response) -> None:
            return None

        async def from_native_response(self, response):
            return response

        async def close(self) -> None:
            return None

    return PolicyClient(channel)


@dataclass
class _Channel:
    """Between verifiers' rollout task and the traingym episode."""

    # ('ask', messages, tools) | ('done', state) | ('raised', exception)
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    reply: asyncio.Future | None = None

    async def ask(self, messages, tools):
        self.reply = asyncio.get_running_loop().create_future()
        await self.events.put(("ask", list(messages), list(tools or [])))
        return await self.reply


async def _rollout(env, example: dict[str, Any], channel: _Channel) -> None:
    """verifiers' rollout loop, its end or exception handed over the channel. A module
    function, not a method: the task must not hold the episode, or the episode could never be
    collected (and its finalizer never cancel the task)."""
    try:
        state = await env.rollout(dict(example), policy_client(channel), "traingym-policy",
                                  dict(env.sampling_args))
    except Exception as e:  # handed over and re-raised by the episode (_next)
        await channel.events.put(("raised", e))
        return
    await channel.events.put(("done", state))


def _cancel_later(loop: asyncio.AbstractEventLoop, task: asyncio.Task) -> None:
    """An episode cut short (max_context_tokens) leaves verifiers' task waiting on its reply:
    the runner cancels it in `close`; an episode driven elsewhere, when it goes away."""
    if not loop.is_closed() and not task.done():
        loop.call_soon_threadsafe(task.cancel)


class VerifiersEnv(MultiTurnEnv):
    """One episode of a verifiers environment (module docstring)."""

    def __init__(self, example: dict[str, Any], renderer: PromptRenderer, env, name: str):
        super().__init__(example, renderer)
        self.env, self.name = env, name
        self.vf = vf_module()
        self.channel = _Channel()
        self._task: asyncio.Task | None = None
        self._seen = 0  # messages of the conversation verifiers has shown so far
        self._tools: list = []
        self._finish = "stop"
        self._info: dict[str, Any] = {}

    async def _next(self):
        event = await self.channel.events.get()
        if event[0] == "raised":
            raise RuntimeError(f"verifiers env {self.name!r} raised in its rollout on row "
                               f"{self.example!r:.200}: {type(event[1]).__name__}: "
                               f"{event[1]}") from event[1]
        return event

    async def reset(self):
        if self.transcript is not None:
            raise RuntimeError("VerifiersEnv is single-use: reset() once")
        loop = asyncio.get_running_loop()
        self._task = loop.create_task(_rollout(self.env, self.example, self.channel))
        weakref.finalize(self, _cancel_later, loop, self._task)
        try:
            event = await self._next()
        except BaseException:
            self._task.cancel()
            raise
        if event[0] != "ask":
            await self._task
            raise RuntimeError(f"verifiers env {self.name!r} ended before the policy's first "
                               f"turn (error: {event[1].get('error')!r}) on row "
                               f"{self.example!r:.200}")
        _, messages, tools = event
        self._seen, self._tools = len(messages), tools
        messages = [_dict(m) for m in messages]
        schemas = [_schema(t) for t in tools] or None
        if schemas:
            probe = [{"role": "user", "content": "-"}]
            if self.renderer.render(probe, schemas) == self.renderer.render(probe):
                text = tools_system_prompt(schemas)  # the template ignores tools=
                if messages[0]["role"] == "system":
                    messages[0] = {**messages[0], "content": messages[0]["content"] + "\n\n"
                                   + text}
                else:
                    messages.insert(0, {"role": "system", "content": text})
                schemas = None
        self._prompt_text = self.renderer.render(messages, schemas)
        self.transcript = Transcript(self.renderer.encode(self._prompt_text))
        return Observation(self.transcript.prompt_ids, self._prompt_text)

    async def close(self) -> None:
        """Cancel verifiers' rollout task if the runner cut the episode (max_turns,
        max_context_tokens) while it waits on a reply (runner: when the collection ends)."""
        if self._task is not None and not self._task.done():
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def step(self, completion):
        self._finish = completion.finish_reason
        result = await super().step(completion)
        if result.done:
            result.info = self._info
        return result

    def _response(self, text: str):
        vf = self.vf
        calls = []
        if self._tools:
            calls = [vf.ToolCall(id=f"call_{self.transcript.turns}_{i}", name=c.name,
                                 arguments=json.dumps(c.arguments))
                     for i, c in enumerate(HermesParser().parse(text))
                     if isinstance(c, ToolCall)]
        finish = "tool_calls" if calls else ("length" if self._finish == "length" else "stop")
        message = vf.ResponseMessage(content=text, finish_reason=finish,
                                     is_truncated=self._finish == "length",
                                     tool_calls=calls or None)
        return vf.Response(id=f"traingym-{id(self)}-{self.transcript.turns}",
                           created=int(time.time()), model="traingym-policy", message=message)

    async def respond(self, text: str) -> Reply:
        if self.transcript.turns == 1:  # the first turn continues the pre-fill
            text = self.renderer.prefill + text
        self.channel.reply.set_result(self._response(text))
        event = await self._next()
        if event[0] == "ask":
            messages = event[1]
            new = [_dict(m) for m in messages[self._seen + 1:]]  # after the policy's turn
            self._seen = len(messages)
            if not new:
                raise RuntimeError(f"verifiers env {self.name!r} asked for another turn without "
                                   "a new message after the policy's")
            return Reply(messages=new)
        state = event[1]
        await self._task
        if state.get("error") is not None:
            raise RuntimeError(f"verifiers env {self.name!r}: its rollout ended with an error "
                               f"on row {self.example!r:.200}: {state['error']!r}")
        reward, parts = await score_state(self.env, state, self.name)
        self._info = {"verifiers": {"rewards": parts, "reward": reward,
                                    "stop": state.get("stop_condition"),
                                    "turns": len(state.get("trajectory") or [])}}
        return Reply(reward=reward, done=True)


async def score_state(env, state, name: str) -> tuple[float, dict[str, float]]:
    """sum(weight x reward function) over the env's rubric(s) for one finished state."""
    from verifiers.utils.async_utils import maybe_await

    total, parts = 0.0, {}
    for r in rubrics(env.rubric):
        objects = None
        for func, weight in zip(r.funcs, r.weights):
            if weight == 0:
                continue
            objects = objects if objects is not None else r.score_objects(state)
            params = inspect.signature(func).parameters
            if any(p.kind == p.VAR_KEYWORD for p in params.values()):
                args = objects
            else:
                args = {k: v for k, v in objects.items() if k in params}
            fname = getattr(func, "__name__", repr(func))
            try:
                value = await maybe_await(func, **args)
            except Exception as e:  # re-raised naming the function and the row
                raise ValueError(f"verifiers env {name!r}: reward function {fname} raised "
                                 f"{type(e).__name__}: {e}\n  row: {state.get('input')!r:.300}"
                                 ) from e
            if isinstance(value, bool) or not isinstance(value, (int, float)) \
                    or not math.isfinite(value):
                raise ValueError(f"verifiers env {name!r}: reward function {fname} returned "
                                 f"{value!r}; it must return a finite number")
            key, i = fname, 1
            while key in parts:  # two functions of one name (lambdas): name_2, name_3...
                i += 1
                key = f"{fname}_{i}"
            parts[key] = float(value)
            total += weight * float(value)
    return total, parts


@dataclass
class VerifiersMaker:
    """Env maker `(example, renderer) -> VerifiersEnv`: by id (`env_id`, `env_args`: loaded
    once per process, so the maker pickles for engine processes) or around an Environment
    object (`env`: one process)."""

    env_id: str | None = None
    env_args: dict[str, Any] = field(default_factory=dict)
    env: Any = None
    env_adapter = "verifiers"  # its record in envs/adapters.py (not a field)

    def __post_init__(self):
        if (self.env_id is None) == (self.env is None):
            raise ValueError("VerifiersMaker takes env_id (with env_args) or env, not both")
        if self.env is not None:
            check_rubric(self.env, type(self.env).__name__)

    @property
    def name(self) -> str:
        return self.env_id or type(self.env).__name__

    def environment(self):
        return self.env if self.env is not None else load_env(self.env_id, self.env_args)

    def rows(self, num_heldout: int) -> tuple[list[dict], list[dict]]:
        """(training rows, held-out rows) from the environment's datasets."""
        return env_rows(self.environment(), num_heldout)

    def check(self, rollout) -> None:
        """ValueError when the environment's turn limit exceeds rollout.max_turns."""
        check_turns(self.environment(), self.name, rollout.max_turns)

    def __call__(self, example: dict[str, Any], renderer: PromptRenderer) -> VerifiersEnv:
        return VerifiersEnv(example, renderer, self.environment(), self.name)
