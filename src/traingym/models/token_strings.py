"""One token as a string, the way OpenAI's API writes it, and back to its id.

A token that decodes to whole characters is its decoded text (`tok.decode([id])`). A token
that holds part of a character (a byte-level BPE piece of a multi-byte character, a
SentencePiece `<0xNN>` byte) decodes to U+FFFD, which names no token; OpenAI's legacy
completions write such a token as `bytes:\\xe6\\x97` (its raw bytes, escaped), and so does
`traingym serve` (serve/responses.py). `piece_ids(tok)` maps these strings back to ids for the
openai engine's 'standard' dialect (rollout/openai_engine.py); a string that two ids share
maps to no id there (the engine then refuses it rather than guess).

Raw bytes are known for byte-level BPE vocabularies (GPT-2's byte-to-unicode alphabet) and
SentencePiece byte-fallback tokens; for other tokens the decoded text is the string.
"""

from __future__ import annotations

import re
from functools import lru_cache

_SP_BYTE = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")


@lru_cache(maxsize=1)
def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet, unicode character -> byte."""
    bs = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
          + list(range(ord("®"), ord("ÿ") + 1)))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def raw_bytes(tok, token_id: int) -> bytes | None:
    """The bytes a token stands for, where the vocabulary says (module docstring)."""
    piece = tok.convert_ids_to_tokens(token_id)
    if piece is None:
        return None
    m = _SP_BYTE.match(piece)
    if m:
        return bytes([int(m.group(1), 16)])
    dec = _byte_decoder()
    if all(c in dec for c in piece):
        return bytes(dec[c] for c in piece)
    return None


def token_str(tok, token_id: int) -> str:
    """The token as text, or `bytes:\\xNN...` where its text is part of a character."""
    text = tok.decode([token_id], skip_special_tokens=False)
    if "\ufffd" in text:
        raw = raw_bytes(tok, token_id)
        if raw is not None and raw != text.encode("utf-8"):
            return "bytes:" + "".join(f"\\x{b:02x}" for b in raw)
    return text


def token_utf8(tok, token_id: int) -> list[int]:
    """The token's bytes for OpenAI's `bytes` field (raw bytes where known)."""
    text = tok.decode([token_id], skip_special_tokens=False)
    raw = raw_bytes(tok, token_id) if "\ufffd" in text else None
    return list(raw if raw is not None else text.encode("utf-8"))


def parse_bytes(piece: str) -> bytes | None:
    """`bytes:\\xNN...` -> the bytes; None for any other string."""
    if not piece.startswith("bytes:"):
        return None
    body = piece[len("bytes:"):]
    if not re.fullmatch(r"(\\x[0-9A-Fa-f]{2})+", body):
        return None
    return bytes(int(body[i + 2:i + 4], 16) for i in range(0, len(body), 4))


def piece_ids(tok) -> dict[str, int]:
    """{token_str: id} over the whole vocabulary, leaving out strings that several ids share.
    Built once per tokenizer (a decode per id)."""
    cached = getattr(tok, "_traingym_piece_ids", None)
    if cached is not None:
        return cached
    out: dict[str, int] = {}
    shared: set[str] = set()
    for i in range(len(tok)):
        s = token_str(tok, i)
        if s in out:
            shared.add(s)
        out[s] = i
    for s in shared:
        del out[s]
    try:
        tok._traingym_piece_ids = out
    except AttributeError:  # a tokenizer that takes no attributes: build each time
        pass
    return out
