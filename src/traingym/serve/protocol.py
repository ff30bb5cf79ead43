"""Request bodies of the OpenAI API as served here (pydantic; unknown fields are refused).

Covered: chat and legacy completions with n, max_tokens (max_completion_tokens), temperature,
top_p, seed, stop (a string or up to 4), stream (+ stream_options.include_usage), logprobs /
top_logprobs, tools with tool_choice 'auto' or 'none'. Accepted and ignored: user, metadata,
store, parallel_tool_calls, service_tier. Refused with a 400 that names them: penalties,
logit_bias, best_of, echo, suffix, response_format other than text, tool_choice naming a
function or 'required'. vLLM-style extras: `continue_final_message` (the last assistant
message is a pre-fill the model continues) and `top_k`.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

_NAME = r"^[A-Za-z0-9_-]{1,64}$"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class FunctionDef(_Strict):
    name: str = Field(pattern=_NAME)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None

    @field_validator("parameters")
    @classmethod
    def _schema(cls, v):
        if v is not None and v.get("type", "object") != "object":
            raise ValueError("a function's parameters must be a JSON schema of type 'object'")
        return v


class Tool(_Strict):
    type: Literal["function"]
    function: FunctionDef


class StreamOptions(_Strict):
    include_usage: bool = False


class _Common(_Strict):
    model: str
    n: int = Field(1, ge=1)
    max_tokens: int | None = Field(None, ge=1)
    temperature: float = Field(1.0, ge=0, le=2)
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = Field(0, ge=0)
    seed: int | None = None
    stop: str | list[str] | None = Field(None, validate_default=True)
    stream: bool = False
    stream_options: StreamOptions | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[str, float] | None = None
    user: str | None = None
    metadata: dict[str, str] | None = None
    store: bool | None = None
    service_tier: str | None = None

    @field_validator("stop")
    @classmethod
    def _stops(cls, v):
        stops = [v] if isinstance(v, str) else (v or [])
        if len(stops) > 4 or any(not s for s in stops):
            raise ValueError("stop takes at most 4 non-empty strings")
        return stops

    def unsupported(self) -> list[str]:
        bad = [k for k in ("presence_penalty", "frequency_penalty") if getattr(self, k)]
        return bad + (["logit_bias"] if self.logit_bias else [])


class ChatRequest(_Common):
    messages: list[dict[str, Any]] = Field(min_length=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    max_completion_tokens: int | None = Field(None, ge=1)
    tools: list[Tool] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    response_format: dict[str, Any] | None = None
    continue_final_message: bool = False

    def unsupported(self) -> list[str]:
        bad = super().unsupported()
        if self.tool_choice not in (None, "auto", "none"):
            bad.append("tool_choice (only 'auto' and 'none')")
        if self.response_format and self.response_format.get("type") != "text":
            bad.append("response_format (only text)")
        return bad


class CompletionRequest(_Common):
    # fail_fast: a list of 300k token ids no longer first fails as list[str] with 300k
    # errors (0.2 s and ~70 MB for nothing)
    prompt: (str | Annotated[list[str], Field(fail_fast=True)]
             | Annotated[list[int], Field(fail_fast=True)]) = Field(min_length=1)
    logprobs: int | None = Field(None, ge=0, le=20)
    best_of: int | None = None
    echo: bool = False
    suffix: str | None = None

    def unsupported(self) -> list[str]:
        bad = super().unsupported()
        if self.best_of not in (None, 1, self.n):
            bad.append("best_of")
        return bad + (["echo"] if self.echo else []) + (["suffix"] if self.suffix else [])
