"""Text in and out: chat messages to a prompt (the chat template), completions to text (stop
strings, incremental streaming pieces), tool calls to the OpenAI format.

Tool schemas and parsing follow envs/tools.py (template `tools=` or a Hermes system message;
HermesParser); a turn with a malformed call is returned as plain content, never half-parsed.
Stop strings: `finish` cuts a whole completion; `TextStream` finds them as tokens arrive, so
continuous batching (serve/continuous.py) ends the row at once. Engines without step decoding
stop on token ids only, so there a stop string saves no decode steps.
"""

from __future__ import annotations

import json
import re
from functools import lru_cache

from traingym.core.toolcalls import BadCall, HermesParser
from traingym.envs.tools import tools_system_prompt
from traingym.serve.limits import ApiError

PARSER = HermesParser()
_ROLES = {"system", "developer", "user", "assistant", "tool"}


def _bad(message: str, param: str = "messages") -> ApiError:
    return ApiError(400, message, "invalid_messages", param)


def _content(m: dict, i: int) -> str | None:
    c = m.get("content")
    if c is None or isinstance(c, str):
        return c
    if isinstance(c, list):
        parts = []
        for p in c:
            text = p.get("text") if isinstance(p, dict) and p.get("type") == "text" else None
            if not isinstance(text, str):
                raise _bad(f"messages[{i}].content: only text parts ({{'type': 'text', 'text': "
                           "...}}) are supported")
            parts.append(p["text"])
        return "".join(parts)
    raise _bad(f"messages[{i}].content must be a string or a list of text parts")


def _calls(m: dict, i: int) -> list[dict]:
    out = []
    calls = m.get("tool_calls") or []
    if not isinstance(calls, list):
        raise _bad(f"messages[{i}].tool_calls must be a list")
    for j, c in enumerate(calls):
        fn = c.get("function") if isinstance(c, dict) else None
        if not (isinstance(fn, dict) and isinstance(fn.get("name"), str)):
            raise _bad(f"messages[{i}].tool_calls[{j}] needs function.name")
        args = fn.get("arguments", "{}")
        try:
            args = json.loads(args) if isinstance(args, str) else args
        except json.JSONDecodeError as e:
            raise _bad(f"messages[{i}].tool_calls[{j}].function.arguments is not JSON ({e.msg})")
        if not isinstance(args, dict):
            raise _bad(f"messages[{i}].tool_calls[{j}].function.arguments must be an object")
        out.append({"id": c.get("id"), "name": fn["name"], "arguments": args})
    return out


def call_text(name: str, arguments: dict) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


@lru_cache(maxsize=8)
def _template_renders(tok, what: str) -> bool:
    """Whether the chat template renders `tools=` / an assistant's `tool_calls` itself."""
    probe = [{"role": "user", "content": "-"}]
    if what == "tools":
        tool = {"type": "function", "function": {"name": "zz_probe_fn", "parameters": {}}}
        return "zz_probe_fn" in tok.apply_chat_template(probe, tools=[tool], tokenize=False)
    call = {"type": "function", "function": {"name": "zz_probe_fn", "arguments": {}}}
    msg = {"role": "assistant", "content": "", "tool_calls": [call]}
    try:
        return "zz_probe_fn" in tok.apply_chat_template(probe + [msg], tokenize=False)
    except Exception:  # a template that raises on tool_calls does not render them
        return False


def messages_for_template(tok, messages: list[dict]) -> list[dict]:
    out, names = [], {}
    calls_native = _template_renders(tok, "calls")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in _ROLES:
            raise _bad(f"messages[{i}] needs a role, one of {sorted(_ROLES)}")
        role, content = m["role"], _content(m, i)
        if role == "tool":
            cid = m.get("tool_call_id")
            if cid not in names:
                raise _bad(f"messages[{i}]: tool_call_id {cid!r} answers no earlier assistant "
                           "tool call")
            out.append({"role": "tool", "name": names[cid], "content": content or ""})
            continue
        if role == "assistant" and m.get("tool_calls"):
            calls = _calls(m, i)
            names.update({c["id"]: c["name"] for c in calls})
            if calls_native:
                out.append({"role": "assistant", "content": content or "", "tool_calls": [
                    {"type": "function", "function": {"name": c["name"], "arguments":
                                                      c["arguments"]}} for c in calls]})
            else:
                text = "\n".join(([content] if content else []) +
                                  [call_text(c["name"], c["arguments"]) for c in calls])
                out.append({"role": "assistant", "content": text})
            continue
        if content is None:
            raise _bad(f"messages[{i}] ({role}) has no content")
        out.append({"role": "system" if role == "developer" else role, "content": content})
    return out


def render_chat(tok, req) -> tuple[str, str]:
    """(prompt text, pre-fill): the pre-fill is the last assistant message's content when
    `continue_final_message` is set (the model continues it; tool calls are parsed from
    pre-fill + completion), else ''."""
    msgs = messages_for_template(tok, req.messages)
    prefill = ""
    if req.continue_final_message:
        if msgs[-1]["role"] != "assistant" or len(msgs) < 2:
            raise _bad("continue_final_message needs a final assistant message to continue")
        prefill = msgs.pop()["content"]
    tools = [t.model_dump(exclude_none=True) for t in req.tools or []]
    if tools and req.tool_choice == "none":
        tools = []
    if tools and not _template_renders(tok, "tools"):
        extra = tools_system_prompt(tools)
        if msgs[0]["role"] == "system":
            msgs[0] = {"role": "system", "content": msgs[0]["content"] + "\n\n" + extra}
        else:
            msgs.insert(0, {"role": "system", "content": extra})
        tools = []
    try:
        text = tok.apply_chat_template(msgs, tools=tools or None, add_generation_prompt=True,
                                       tokenize=False)
    except Exception as e:  # the template's own check (e.g. roles must alternate)
        raise _bad(f"the model's chat template refused these messages: {e}") from None
    return text + prefill, prefill


_BLOCK = re.compile(re.escape(PARSER.open_tag) + r".*?" + re.escape(PARSER.close_tag), re.DOTALL)


def tool_calls(text: str) -> tuple[str | None, list[dict]]:
    """(content, OpenAI tool_calls) of an answer; malformed calls leave it plain content."""
    calls = PARSER.parse(text)
    if not calls or any(isinstance(c, BadCall) for c in calls):
        return text, []
    rest = _BLOCK.sub("", text).strip()
    return rest or None, [{"name": c.name, "arguments": json.dumps(c.arguments)} for c in calls]


def finish(tok, ids: list[int], finish_reason: str, stops: list[str],
           stop_ids: tuple[int, ...]) -> tuple[str, int, str, list[str]]:
    """(text, tokens kept, finish_reason, one text piece per kept token): the end-of-turn
    token is dropped from the text; the text ends before the first stop string."""
    body = ids[:-1] if finish_reason == "stop" and ids and ids[-1] in stop_ids else ids
    text = tok.decode(body, skip_special_tokens=False)
    ends, stable = [], 0
    for i in range(len(body)):  # where each token's text ends (held back mid-character)
        prefix = tok.decode(body[: i + 1], skip_special_tokens=False)
        if not prefix.endswith("\ufffd") and text.startswith(prefix):
            stable = len(prefix)
        ends.append(stable)
    if ends:
        ends[-1] = len(text)
    cut = min((p for p in (text.find(s) for s in stops) if p >= 0), default=-1)
    if cut >= 0:
        text, finish_reason = text[:cut], "stop"
        starts = [0] + ends[:-1]
        body = [t for t, s in zip(body, starts) if s < cut] if cut else []
        ends = [min(e, cut) for e in ends[: len(body)]]
    pieces = [text[a:b] for a, b in zip([0] + ends[:-1], ends)]
    return text, len(body), finish_reason, pieces


class TextStream:
    """The text of one completion as its tokens arrive, for token-by-token streaming.

    `feed(token)` returns (new text, tokens released): text goes out once it is final, i.e.
    no trailing incomplete character (a byte-level piece that decodes to U+FFFD waits for
    the rest of its bytes) and no trailing part that could begin a stop string (held until
    the next tokens show whether the stop string follows). A token is released (its
    log-probs may be sent) once the text sent covers it. On a stop string, the text ends
    before it and `stopped` is set; the caller ends the row. `end(reason)` flushes the rest.
    The pieces sent concatenate to `finish`'s text for the same tokens, and the tokens
    released are `finish`'s kept tokens, with `piece(i)` its pieces, for tokenizers whose
    decode of a prefix is a prefix of the decode (byte-level BPE, SentencePiece). Each token
    decodes the whole completion again: quadratic in its length, as `finish` is."""

    def __init__(self, tok, stops: list[str], stop_ids):
        self.tok, self.stops, self.stop_ids = tok, [s for s in stops if s], set(stop_ids)
        self.ids: list[int] = []
        self.ends: list[int] = []  # where each token's text ends (held back mid-character)
        self.text, self.sent, self.released = "", 0, 0
        self.finish_reason: str | None = None
        self.stopped = False  # by a stop string

    def start(self, i: int) -> int:
        return self.ends[i - 1] if i else 0

    def piece(self, i: int) -> str:
        return self.text[self.start(i):min(self.ends[i], self.sent)]

    def feed(self, token: int) -> tuple[str, list[int]]:
        if self.finish_reason is not None:
            return "", []
        if token in self.stop_ids:
            return self.end("stop")
        self.ids.append(token)
        self.text = self.tok.decode(self.ids, skip_special_tokens=False)
        stable = self.ends[-1] if self.ends else 0
        if not self.text.endswith("\ufffd"):
            stable = len(self.text)
        self.ends.append(stable)
        cut = self._stop_at(self.text)
        if cut >= 0:
            self.stopped = True
            return self._close(cut, "stop")
        return self._send(stable - self._held(self.text[:stable]))

    def end(self, reason: str) -> tuple[str, list[int]]:
        """The rest of the text (the completion ended: `reason` 'stop' or 'length')."""
        if self.finish_reason is not None:
            return "", []
        return self._close(len(self.text), reason, keep_all=True)

    def _stop_at(self, text: str) -> int:
        return min((p for p in (text.find(s) for s in self.stops) if p >= 0), default=-1)

    def _held(self, text: str) -> int:
        """Length of the longest end of `text` that begins a stop string."""
        for k in range(min(len(text), max((len(s) for s in self.stops), default=1) - 1), 0, -1):
            if any(s.startswith(text[-k:]) for s in self.stops):
                return k
        return 0

    def _send(self, upto: int) -> tuple[str, list[int]]:
        new = self.text[self.sent:upto] if upto > self.sent else ""
        self.sent = max(self.sent, upto)
        done = self.released
        while (done < len(self.ids) and self.ends[done] <= self.sent
               and self.start(done) < self.sent):
            done += 1
        out, self.released = list(range(self.released, done)), done
        return new, out

    def _close(self, cut: int, reason: str, keep_all: bool = False) -> tuple[str, list[int]]:
        self.finish_reason = reason
        if self.ends:
            self.ends[-1] = len(self.text)
        new = self.text[self.sent:cut]
        self.sent = cut
        keep = [i for i in range(self.released, len(self.ids))
                if keep_all or self.start(i) < cut]
        self.released = len(self.ids)
        return new, keep
