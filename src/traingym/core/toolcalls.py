"""Tool calls in a policy's text: the records, the parser protocol, and the Hermes format
(`<tool_call>{json}</tool_call>`, used by Hermes, Qwen and SmolLM2). Shared by the tool env
(envs/tools.py), the samples log (observability/events.py) and serve."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Protocol


@dataclass
class ToolCall:
    name: str
    arguments: dict[str, Any]


@dataclass
class BadCall:
    """A call that could not be parsed; `message` is what the policy sees as the result."""

    message: str


class ToolCallParser(Protocol):
    def parse(self, text: str) -> list[ToolCall | BadCall]:
        """Every tool call in one policy turn, in order; [] when the turn calls no tool."""
        ...


@dataclass(frozen=True)
class HermesParser:
    """`<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks (Hermes, Qwen, SmolLM2);
    `arguments` may also be a JSON string holding the object."""

    open_tag: str = "<tool_call>"
    close_tag: str = "</tool_call>"

    def parse(self, text: str) -> list[ToolCall | BadCall]:
        calls: list[ToolCall | BadCall] = []
        pattern = re.escape(self.open_tag) + r"(.*?)(" + re.escape(self.close_tag) + r"|$)"
        for m in re.finditer(pattern, text, re.DOTALL):
            body, closed = m.group(1).strip(), bool(m.group(2))
            if not closed:
                calls.append(BadCall(f"tool call not closed with {self.close_tag}"))
                continue
            calls.append(self._one(body))
        return calls

    def _one(self, body: str) -> ToolCall | BadCall:
        try:
            obj = json.loads(body)
        except json.JSONDecodeError as e:
            return BadCall(f"tool call is not valid JSON ({e.msg} at char {e.pos})")
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            return BadCall('a tool call must be a JSON object {"name": ..., "arguments": {...}}')
        args = obj.get("arguments", {})
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except json.JSONDecodeError as e:
                return BadCall(f"arguments of {obj['name']} are not valid JSON ({e.msg})")
        if not isinstance(args, dict):
            return BadCall(f"arguments of {obj['name']} must be a JSON object")
        return ToolCall(obj["name"], args)
