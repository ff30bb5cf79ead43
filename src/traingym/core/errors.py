"""The error a bad config raises, the closest-name hint every error message uses, and the strict
pydantic base of every config section."""

from __future__ import annotations

import difflib

from pydantic import BaseModel, ConfigDict


class ConfigError(ValueError):
    """A config that cannot run; the message names the problem and the fix."""


def closest(word: str, choices) -> str | None:
    """The choice most like `word` (difflib ratio >= 0.6), or None when none is close."""
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return close[0] if close else None


def did_you_mean(word: str, choices) -> str:
    """"; did you mean 'x'?" for the closest of `choices`, or "" when none is close."""
    match = closest(word, choices)
    return f"; did you mean {match!r}?" if match else ""


class Strict(BaseModel):
    """A config section: unknown keys are errors, assignments are validated."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)
