"""core/memory.huge_pages: torch's large CPU tensors on transparent huge pages, set before the
first tensor (torch reads its switch once) and not passed on to child processes, with the
user's own environment setting winning. Each case runs in a fresh interpreter, since the switch
is per process."""

from __future__ import annotations

import json
import subprocess
import sys

from traingym.core.memory import thp_mode

PROBE = r"""
import json, os, sys
from traingym.core import memory
granted = memory.huge_pages(sys.argv[1] == "on")
import torch
x = torch.ones(16 * 2**20)  # 64 MiB, touched
addr = x.data_ptr()
huge, region = 0, None
smaps = "/proc/self/smaps"
for line in (open(smaps) if os.path.exists(smaps) else ()):  # Linux only; elsewhere no THP
    head = line.split()
    if "-" in head[0] and len(head) > 4:
        lo, hi = (int(v, 16) for v in head[0].split("-"))
        region = lo <= addr < hi
    elif region and head[0] == "AnonHugePages:":
        huge = int(head[1])
print(json.dumps({"granted": granted, "env": os.environ.get("THP_MEM_ALLOC_ENABLE"),
                  "huge_kib": huge}))
"""


def probe(mode: str, env: dict | None = None) -> dict:
    import os

    full = {k: v for k, v in os.environ.items() if k != "THP_MEM_ALLOC_ENABLE"}
    out = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True,
                         env={**full, **(env or {})}, check=True)
    return json.loads(out.stdout)


def test_huge_pages_back_a_large_tensor_and_the_environment_wins():
    on, off = probe("on"), probe("off")
    kept = probe("on", {"THP_MEM_ALLOC_ENABLE": "0"})  # the user's own setting is kept
    # the switch leaves no variable behind for child processes; the user's stays
    assert (on["env"], off["env"], kept["env"]) == (None, None, "0")
    if thp_mode() == "madvise":  # granted on request only: the tensor sits on 2 MiB pages
        assert on["granted"] and on["huge_kib"] >= 32 * 1024, on
        assert off["huge_kib"] == 0 and kept["huge_kib"] == 0
    elif thp_mode() == "never":
        assert not on["granted"] and on["huge_kib"] == 0
