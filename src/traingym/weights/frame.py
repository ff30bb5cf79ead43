"""The wire format of a payload: no pickles, a JSON header and raw buffers.

    b"TGWSYNC1" | u64 header length | 16-byte xxh3-128 of the header | header JSON
    | zero padding to 64 | each buffer, padded to 64

The header carries the hash of the buffers (`body_hash`), so a flipped byte anywhere is
caught: in the header by its digest, in the body by `verify_body`. Parsing is zero-copy.
"""

from __future__ import annotations

import dataclasses
import json
import struct

from traingym.weights.base import IntegrityError, Payload, TensorEntry, UpdateHeader
from traingym.weights.hashing import buffers_hash, bytes_hash

MAGIC = b"TGWSYNC1"
ALIGN = 64
_PREFIX = struct.Struct("<8sQ16s")
_ZEROS = bytes(ALIGN)


def _pad(n: int) -> int:
    return (-n) % ALIGN


def seal(payload: Payload) -> Payload:
    """Fill in buffer sizes and the body hash."""
    header = dataclasses.replace(
        payload.header,
        buffer_sizes=tuple(b.nbytes for b in payload.buffers),
        body_hash=buffers_hash(payload.buffers),
    )
    return Payload(header, payload.buffers)


def header_bytes(header: UpdateHeader) -> bytes:
    d = dataclasses.asdict(header)
    for t in d["tensors"]:
        if not t["span"]:
            del t["span"]  # a whole tensor: the common case costs no header bytes
    return json.dumps(d, separators=(",", ":")).encode()


def to_views(payload: Payload) -> list[memoryview]:
    """The frame as a list of byte views (header first); nothing large is copied."""
    hb = header_bytes(payload.header)
    head = _PREFIX.pack(MAGIC, len(hb), bytes_hash(hb)) + hb
    views = [memoryview(head + _ZEROS[: _pad(len(head))])]
    for b in payload.buffers:
        views.append(memoryview(b).cast("B"))
        if _pad(b.nbytes):
            views.append(memoryview(_ZEROS[: _pad(b.nbytes)]))
    return views


def frame_size(payload: Payload) -> int:
    return sum(v.nbytes for v in to_views(payload))


def to_bytes(payload: Payload) -> bytes:
    return b"".join(to_views(payload))


def parse_header(data: dict) -> UpdateHeader:
    tensors = tuple(
        TensorEntry(
            name=t["name"], dtype=t["dtype"], shape=tuple(t["shape"]), method=t["method"],
            buffers=tuple(t["buffers"]), n_changed=t["n_changed"], params=tuple(t["params"]),
            span=tuple(t.get("span", ())),
        )
        for t in data["tensors"]
    )
    return UpdateHeader(
        codec=data["codec"], target_version=data["target_version"],
        target_hash=data["target_hash"], base_version=data["base_version"],
        base_hash=data["base_hash"], tensors=tensors,
        buffer_sizes=tuple(data["buffer_sizes"]), body_hash=data["body_hash"],
        full_hash=data.get("full_hash", ""),
    )


def from_buffer(buf) -> Payload:
    """Parse a whole frame (bytes, bytearray, mmap). Checks the header digest and sizes."""
    mv = memoryview(buf).cast("B")
    if mv.nbytes < _PREFIX.size:
        raise IntegrityError("frame shorter than its prefix")
    magic, hlen, digest = _PREFIX.unpack_from(mv, 0)
    if magic != MAGIC:
        raise IntegrityError(f"bad magic {magic!r}")
    start = _PREFIX.size
    if start + hlen > mv.nbytes:
        raise IntegrityError("truncated header")
    hb = bytes(mv[start : start + hlen])
    if bytes_hash(hb) != digest:
        raise IntegrityError("header digest mismatch")
    header = parse_header(json.loads(hb))
    off = start + hlen
    off += _pad(off)
    buffers = []
    for size in header.buffer_sizes:
        if off + size > mv.nbytes:
            raise IntegrityError("truncated body")
        buffers.append(mv[off : off + size])
        off += size + _pad(size)
    return Payload(header, buffers)


def verify_body(payload: Payload) -> None:
    if buffers_hash(payload.buffers) != payload.header.body_hash:
        raise IntegrityError(
            f"body hash mismatch in update to version {payload.header.target_version}"
        )
