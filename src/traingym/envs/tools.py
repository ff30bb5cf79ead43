"""Tool use: tools are plain typed Python functions; the policy calls them in its own turns.

A tool's type hints and Google-style `Args:` docstring become its JSON schema (transformers'
`get_json_schema`), passed to the chat template as `tools=`, or as a Hermes-style system
message when the template ignores `tools`. Calls are parsed by a pluggable parser (default
`<tool_call>{...}</tool_call>`), with task.prefill in front so a pre-fill may open a call.
Results go back as `tool` messages; a turn without a call ends the episode, scored by
`reward(sample)`. Malformed calls and raising tools become an "Error: ..." result the policy
sees. Calls of one turn run concurrently; a sync tool blocks the event loop.
Not covered: tool timeouts (give an async tool its own), streaming results, `tool_call_id`.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import json
import typing
from dataclasses import dataclass, field
from typing import Any, Callable

from pydantic import TypeAdapter, ValidationError

from traingym.core.toolcalls import BadCall, HermesParser, ToolCall, ToolCallParser
from traingym.envs.multi_turn import MultiTurnEnv, Reply
from traingym.envs.render import PromptRenderer
from traingym.envs.single_turn import RewardFn, score


def tool_schema(fn: Callable) -> dict:
    """The JSON schema of a typed, documented function (fails naming what is missing)."""
    from transformers.utils import get_json_schema

    return get_json_schema(fn)


@functools.cache
def _checkers(fn: Callable) -> tuple[inspect.Signature, dict[str, TypeAdapter]]:
    hints = typing.get_type_hints(fn)
    sig = inspect.signature(fn)
    return sig, {name: TypeAdapter(hints.get(name, Any)) for name in sig.parameters}


async def run_call(tools: dict[str, Callable], call: ToolCall | BadCall) -> tuple[str, str]:
    """(tool name, result text); failures come back as "Error: ..." text, never raised."""
    if isinstance(call, BadCall):
        return "error", f"Error: {call.message}"
    fn = tools.get(call.name)
    if fn is None:
        return call.name, f"Error: unknown tool {call.name!r}; available: {sorted(tools)}"
    sig, adapters = _checkers(fn)
    try:
        bound = sig.bind(**call.arguments)
    except TypeError as e:
        return call.name, f"Error: wrong arguments for {call.name}: {e}"
    args = {}
    for name, value in bound.arguments.items():
        try:
            args[name] = adapters[name].validate_python(value)
        except ValidationError as e:
            problem = e.errors()[0]["msg"]
            return call.name, f"Error: argument {name!r} of {call.name}: {problem}"
    try:
        result = await fn(**args) if inspect.iscoroutinefunction(fn) else fn(**args)
    except Exception as e:  # the policy sees the tool's failure as its result; the run goes on
        return call.name, f"Error: {call.name} raised {type(e).__name__}: {e}"
    return call.name, result if isinstance(result, str) else json.dumps(result, default=str)


def tools_system_prompt(schemas: list[dict]) -> str:
    """The Hermes / Qwen2.5 tool instructions, for templates that ignore `tools=`."""
    lines = "\n".join(json.dumps(s) for s in schemas)
    return ("# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
            "You are provided with function signatures within <tools></tools> XML tags:\n"
            f"<tools>\n{lines}\n</tools>\n\nFor each function call, return a json object with "
            "function name and arguments within <tool_call></tool_call> XML tags:\n"
            '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n'
            "</tool_call>")


@dataclass
class ToolTask:
    """Env maker for tool use: `ToolTask([add, lookup], reward)(example, renderer) -> ToolEnv`.
    Picklable when the tools, reward and parser are module-level."""

    tools: list[Callable]
    reward: RewardFn
    parser: ToolCallParser = HermesParser()
    max_result_chars: int = 2000  # longer results are cut, with a note saying so
    schemas: list[dict] = field(init=False)

    def __post_init__(self):
        self.schemas = [tool_schema(fn) for fn in self.tools]
        names = [s["function"]["name"] for s in self.schemas]
        if len(set(names)) != len(names):
            raise ValueError(f"tool names must be unique, got {names}")
        for fn in self.tools:
            _checkers(fn)  # unsupported annotations fail here, before any work

    def __call__(self, example: dict[str, Any], renderer: PromptRenderer) -> ToolEnv:
        return ToolEnv(example, renderer, self)


class ToolEnv(MultiTurnEnv):
    def __init__(self, example: dict[str, Any], renderer: PromptRenderer, task: ToolTask):
        super().__init__(example, renderer)
        self.task = task
        self.tools = {s["function"]["name"]: fn for s, fn in zip(task.schemas, task.tools)}
        probe = [{"role": "user", "content": "-"}]
        self._template_has_tools = renderer.render(probe, task.schemas) != renderer.render(probe)

    def tool_schemas(self) -> list[dict] | None:
        return self.task.schemas if self._template_has_tools else None

    def first_messages(self) -> list[dict[str, Any]]:
        messages = super().first_messages()
        if self._template_has_tools:
            return messages
        tools_text = tools_system_prompt(self.task.schemas)
        if messages[0]["role"] == "system":
            return [{"role": "system", "content": messages[0]["content"] + "\n\n" + tools_text},
                    *messages[1:]]
        return [{"role": "system", "content": tools_text}, *messages]

    async def respond(self, text: str) -> Reply:
        if self.transcript.turns == 1:  # the first turn continues the pre-fill (render())
            text = self.renderer.prefill + text
        calls = self.task.parser.parse(text)
        if not calls:
            return Reply(reward=score(self.task.reward, self.sample()), done=True)
        results = await asyncio.gather(*(run_call(self.tools, c) for c in calls))
        cap = self.task.max_result_chars
        return Reply(messages=[
            {"role": "tool", "name": name,
             "content": out if len(out) <= cap else out[:cap] + f"... [cut at {cap} chars]"}
            for name, out in results])
