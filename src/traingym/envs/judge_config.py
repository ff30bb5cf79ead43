"""The judge's configuration ([task.judge], JudgeConfig) and its parse rules (parse_score);
what they mean: envs/judge.py's docstring."""

from __future__ import annotations

import math
import re
import string
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

FIELDS = ("prompt", "completion", "answer")
DEFAULT_PROMPT = (
    "Question: {prompt}\nReference answer: {answer}\nStudent answer: {completion}\n\n"
    "Is the student answer correct? Answer yes or no.")
_NUMBER = re.compile(r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?")  # 7, -2.5, .5, 1e3
_FIRST_WORD = re.compile(r"\W*(\w+)")  # the answer's first word, after any punctuation


class ParseFailure(ValueError):
    """The judge's answer did not parse under the rule; the message says why."""


def template_fields(template: str) -> list[str]:
    """The field names of a judge prompt template (string.Formatter's reading); a field with
    a conversion ({x!r}) or a format spec ({x:>9}), or a template that does not parse, is
    refused: the fields are filled with plain text."""
    try:
        parts = list(string.Formatter().parse(template))
    except ValueError as e:
        raise ValueError(f"task.judge.prompt is not a valid template ({e}); write literal "
                         "braces as {{ and }}") from None
    for _, name, spec, conversion in parts:
        if name is not None and (spec or conversion):
            raise ValueError(f"task.judge.prompt: the field {{{name}"
                             f"{'!' + conversion if conversion else ''}"
                             f"{':' + spec if spec else ''}}} has a conversion or format spec; "
                             f"write it as {{{name}}} (literal braces as {{{{ and }}}})")
    return [name for _, name, _, _ in parts if name is not None]


class JudgeConfig(BaseModel):
    """[task.judge]: a reward from an LLM judge (envs/judge.py)."""

    model_config = ConfigDict(extra="forbid")
    model: str = Field(description="the judge's weights: 'tiny', 'embedded', a local HF folder "
                       "or a run's checkpoint folder (engines that take weights); for "
                       "engine='openai', the folder (or 'tiny'/'embedded') of the tokenizer "
                       "the server uses")
    engine: str = Field("torch", description="the judge's engine (rollout/registry.py): "
                        "'torch', 'vllm', 'openai' (an OpenAI-compatible URL) or 'module:Class'")
    engine_options: dict[str, Any] = Field(default_factory=dict, description="the engine's "
                                           "options, e.g. openai: {base_url = 'http://...'}")
    prompt: str = Field(DEFAULT_PROMPT, description="the judge's prompt, with {prompt}, "
                        "{completion} and {answer}; sent as one user message through the "
                        "judge's chat template (see `chat`)")
    parse: str = Field("yes_no", description="'yes_no', 'number' or 'regex:<pattern>' "
                       "(envs/judge.py's docstring)")
    score_range: tuple[float, float] | None = Field(None, description="[lo, hi]: a parsed "
                                                    "score outside is a failure")
    max_tokens: int = Field(16, ge=1, description="tokens the judge may write")
    temperature: float = Field(0.0, ge=0, description="the judge's sampling temperature "
                               "(0: greedy)")
    timeout_s: float = Field(120.0, gt=0, description="seconds one batched judge call may "
                             "take; past it every sample of the call failed")
    on_failure: str = Field("error", description="what a failed or unparseable judgement "
                            "counts as: 'error' (stop the run), 'score:<x>' (reward x) or "
                            "'drop' (leave the sample's group out of training)")
    chat: bool = Field(True, description="render the prompt with the judge tokenizer's chat "
                       "template (False: the raw text)")
    seed: int = Field(0, description="seed of the judge's sampling (temperature > 0)")
    dtype: Literal["auto", "bfloat16", "float32"] = Field(
        "auto", description="dtype of the judge engine's weights (as model.engine_dtype)")

    @field_validator("prompt")
    @classmethod
    def _template(cls, v: str) -> str:
        names = template_fields(v)
        bad = [n for n in names if n not in FIELDS]
        if bad:
            raise ValueError(f"task.judge.prompt names {bad}; it may use only {{prompt}}, "
                             "{completion} and {answer} (write literal braces as {{ and }})")
        if "completion" not in names:
            raise ValueError("task.judge.prompt has no {completion}: the judge would not see "
                             "what it judges; add {completion} to the template")
        return v

    @field_validator("parse")
    @classmethod
    def _rule(cls, v: str) -> str:
        if v in ("yes_no", "number"):
            return v
        if v.startswith("regex:"):
            try:
                re.compile(v[len("regex:"):])
            except re.error as e:
                raise ValueError(f"task.judge.parse {v!r}: the pattern does not compile ({e})"
                                 ) from None
            return v
        raise ValueError(f"task.judge.parse={v!r}: use 'yes_no', 'number' or "
                         "'regex:<pattern>' (e.g. 'regex:Score: (\\d+)')")

    @field_validator("on_failure")
    @classmethod
    def _policy(cls, v: str) -> str:
        if v in ("error", "drop"):
            return v
        if v.startswith("score:"):
            try:
                x = float(v[len("score:"):])
            except ValueError:
                x = math.nan
            if math.isfinite(x):
                return v
        raise ValueError(f"task.judge.on_failure={v!r}: use 'error', 'drop' or 'score:<x>' "
                         "with a finite number x (e.g. 'score:0')")

    @model_validator(mode="after")
    def _engine(self) -> JudgeConfig:
        from traingym.rollout import registry  # heavy: safetensors, torch

        try:
            registry.options(self.engine, self.engine_options)
        except ValueError as e:
            raise ValueError(str(e).replace("rollout.engine_options",
                                            "task.judge.engine_options")) from None
        if self.score_range is not None and not self.score_range[0] < self.score_range[1]:
            raise ValueError(f"task.judge.score_range={list(self.score_range)}: lo must be "
                             "below hi")
        return self


def parse_score(rule: str, text: str) -> float:
    """The score `rule` reads from the judge's answer `text`; ParseFailure says why not."""
    if rule == "yes_no":
        m = _FIRST_WORD.match(text)
        word = m.group(1).lower() if m else None
        if word not in ("yes", "no"):
            raise ParseFailure(f"the answer {text[:80]!r} does not start with the word 'yes' "
                               "or 'no'")
        return 1.0 if word == "yes" else 0.0
    if rule == "number":
        m = _NUMBER.search(text)
        if m is None:
            raise ParseFailure(f"no number in the answer {text[:80]!r}")
        value = float(m.group())
        if not math.isfinite(value):
            raise ParseFailure(f"the answer's number {m.group()[:40]!r} is not finite")
        return value
    pattern = rule[len("regex:"):]
    m = re.search(pattern, text)
    if m is None:
        raise ParseFailure(f"pattern {pattern!r} does not match the answer {text[:80]!r}")
    found = m.group(1) if m.groups() else m.group()
    try:
        value = float(found)
    except (TypeError, ValueError):
        raise ParseFailure(f"pattern {pattern!r} matched {found!r}, which is not a number"
                           ) from None
    if not math.isfinite(value):
        raise ParseFailure(f"pattern {pattern!r} matched {found!r}, not a finite number")
    return value
