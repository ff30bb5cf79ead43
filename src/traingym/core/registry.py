"""One registry class for every seam: name -> "module:attr", loaded on first use.

A seam (engines, algorithms, transports, codecs, sinks, sandbox backends, env adapters) keeps
one `Registry`; adding a variant is one file plus one `entries` line, or a "module:attr"
string from the user. `check` (optional) validates what was loaded (a class with the seam's
methods, a record of the right type) and returns it; a failed check, an unknown name or an
import error is a `RegistryError` (a ValueError) naming the key, the choices and the closest.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any, Callable

from traingym.core.errors import did_you_mean


class RegistryError(ValueError):
    """An unknown name, a path that does not import, or an object the seam cannot use."""


class Registry:
    def __init__(self, key: str, entries: dict[str, str], *, kind: str = "class",
                 check: Callable[[str, Any], Any] | None = None,
                 error: type[RegistryError] = RegistryError):
        self.key = key  # the config key users set, e.g. "rollout.engine" (for messages)
        self.entries = entries
        self.kind = kind  # what a "module:attr" names, e.g. "class" or "record"
        self._check = check
        self._error = error
        self._loaded: dict[tuple[str, Any], Any] = {}  # (name, target) -> checked object
        self.module = sys._getframe(1).f_globals.get("__name__", "")  # where it is defined
        _ALL[key] = self

    def names(self) -> list[str]:
        return sorted(self.entries)

    def register(self, name: str, target: str) -> None:
        """Add `name` -> "module:attr" (tests and plugins; the tree uses `entries`)."""
        self.entries[name] = target

    def get(self, name: str) -> Any:
        """The object registered as `name`, or at a "module:attr" path."""
        target = self.entries.get(name, name)
        key = (name, target if isinstance(target, str) else id(target))
        if key in self._loaded:  # keyed by the target too: a changed entry loads afresh
            return self._loaded[key]
        if not isinstance(target, str):  # a record registered as itself
            obj = target
        else:
            module, _, attr = target.partition(":")
            if not module or not attr:
                raise self._error(f"unknown {self.key} {name!r}; choose one of {self.names()} "
                                  f"or give a 'module:{self.kind}' path"
                                  f"{did_you_mean(name, self.entries)}")
            try:
                obj = getattr(importlib.import_module(module), attr)
            except (ImportError, AttributeError, SyntaxError) as e:
                raise self._error(f"{self.key} {name!r}: cannot load {target}: "
                                  f"{type(e).__name__}: {e}") from e
        if self._check is not None:
            try:
                obj = self._check(name, obj)
            except RegistryError:
                raise
            except (TypeError, ValueError) as e:
                raise self._error(f"{self.key} {name!r}: {target}: {e}") from None
        self._loaded[key] = obj
        return obj

    def able(self, ability: str, names: list[str] | None = None) -> list[str]:
        """The registered names whose object's `abilities.<ability>` is true."""
        return [n for n in (self.names() if names is None else names)
                if getattr(self.get(n).abilities, ability)]


_ALL: dict[str, Registry] = {}  # every registry made, by key


def snapshot() -> dict[str, tuple[str, dict[str, str]]]:
    """Every registry's "module:attr" entries (those registered at run time included), for a
    process started to do a run's work (an engine process): `restore` there."""
    return {k: (r.module, {n: t for n, t in r.entries.items() if isinstance(t, str)})
            for k, r in _ALL.items()}


def restore(snap: dict[str, tuple[str, dict[str, str]]]) -> None:
    """Registries as `snapshot` saw them in the parent (their modules imported first)."""
    for key, (module, entries) in snap.items():
        if key not in _ALL and module:
            importlib.import_module(module)
        if key in _ALL:
            _ALL[key].entries.update(entries)


def one_of(names: list[str]) -> str:
    """"'a'", "'a' or 'b'", "'a', 'b' or 'c'"."""
    quoted = [repr(n) for n in names]
    if not quoted:
        return "(none registered)"
    return quoted[0] if len(quoted) == 1 else ", ".join(quoted[:-1]) + " or " + quoted[-1]
