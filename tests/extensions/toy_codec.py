"""A toy weight codec: a full codec variant (every tensor's bytes, raw) whose payloads carry
its own name, "toy_full", and which appends "encode <pid> <tensors>" / "decode <pid>
<tensors>" to the file named by $TOY_CODEC_LOG when set. Test-only: proof (or not) that a
codec is one file plus one registry line (weights/base.py CODECS) chosen by `weights.codec`.
"""

from __future__ import annotations

import dataclasses
import os

from traingym.weights.base import Payload
from traingym.weights.codecs import FullCodec, apply


def _log(line: str) -> None:
    if os.environ.get("TOY_CODEC_LOG"):
        with open(os.environ["TOY_CODEC_LOG"], "a") as f:
            f.write(line + "\n")


class ToyFullCodec:
    type = "toy_full"

    def encode(self, old, new) -> Payload:
        p = FullCodec().encode(old, new)
        _log(f"encode {os.getpid()} {len(p.header.tensors)}")
        return Payload(dataclasses.replace(p.header, codec=self.type), p.buffers)

    def decode(self, old, payload: Payload):
        _log(f"decode {os.getpid()} {len(payload.header.tensors)}")
        return apply(None, payload)
