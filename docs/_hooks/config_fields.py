"""mkdocs hook: `<!-- config-fields -->` in a page becomes one table per config section (key,
type, default, description), read from `traingym.config.schema.Config` when the site is built,
so the reference cannot drift from the code. Named in mkdocs.yml's `hooks`; this folder is
excluded from the site (`exclude_docs`)."""

from __future__ import annotations

import html
import re

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

MARKER = "<!-- config-fields -->"


def _type(annotation) -> str:
    text = annotation.__name__ if isinstance(annotation, type) else repr(annotation)
    text = re.sub(r"\b(typing|pathlib|traingym(\.\w+)*)\.", "", text).replace("NoneType", "None")
    union = re.fullmatch(r"(?:Optional|Union)\[(.*)\]", text)
    if union:  # Union[a, b] as a | b (Optional[a] as a | None), as the code spells it
        parts = _split(union.group(1))
        text = " | ".join(parts + (["None"] if text.startswith("Optional") else []))
    return text


def _split(args: str) -> list[str]:
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(args):
        depth += ch in "[(" and 1 or ch in "])" and -1 or 0
        if ch == "," and depth == 0:
            parts.append(args[start:i].strip())
            start = i + 1
    return parts + [args[start:].strip()]


def _model(annotation) -> type[BaseModel] | None:
    """The config model a field holds (a section, or an optional one such as task.judge)."""
    for candidate in (annotation, *getattr(annotation, "__args__", ())):
        if isinstance(candidate, type) and issubclass(candidate, BaseModel):
            return candidate
    return None


def _default(field) -> str:
    if field.default_factory is not None:
        value = field.default_factory()
    elif field.default is PydanticUndefined:
        return "required"
    else:
        value = field.default
    if isinstance(value, BaseModel):
        return "(section)"
    return _code(repr(value))


def _cell(text: str) -> str:
    """Description text for a table cell: `code spans` kept; elsewhere HTML, table pipes, link
    brackets, emphasis stars and attr_list braces escaped."""
    parts = re.split(r"(`[^`]*`)", text.replace("\n", " "))
    return "".join(_code(p[1:-1]) if p.startswith("`") and len(p) > 1 else
                   re.sub(r"([|\[\]*])", r"\\\1", html.escape(p, quote=False))
                   .replace("{", "&#123;") for p in parts)  # no attr_list {...}


def _code(text: str) -> str:
    return "`" + text.replace("\n", " ") + "`"  # a pipe inside a code span splits no cell


def _section(prefix: str, model: type[BaseModel], out: list[str]) -> None:
    rows, nested = [], []
    for name, field in model.model_fields.items():
        key = field.alias or name
        annotation = field.annotation
        sub = _model(annotation)
        if sub is not None:
            nested.append((f"{prefix}{key}", sub))
            if sub is annotation:  # a section: its own table below
                continue
        rows.append(f"| `{prefix}{key}` | {_code(_type(annotation))} | {_default(field)} "
                    f"| {_cell(field.description or '')} |")
    if rows:
        title = prefix.rstrip(".") or "top level"
        doc = (model.__dict__.get("__doc__") or "").strip().split("\n\n")[0]
        out += [f"### `{title}`", ""] + ([_cell(" ".join(doc.split())), ""] if doc else [])
        out += ["| key | type | default | meaning |", "|---|---|---|---|", *rows, ""]
    for key, sub in nested:
        _section(f"{key}.", sub, out)


def config_tables() -> str:
    from traingym.config.schema import Config

    out: list[str] = []
    _section("", Config, out)
    return "\n".join(out)


def on_page_markdown(markdown: str, page, config, files) -> str:
    if MARKER not in markdown:
        return markdown
    return markdown.replace(MARKER, config_tables())
