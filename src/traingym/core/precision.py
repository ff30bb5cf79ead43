"""Which dtypes a run computes in: bf16 where the hardware has fast bf16 kernels, else fp32.

`model.engine_dtype` and `trainer.bf16_autocast` default to "auto". On a CPU, bf16 pays only where
oneDNN has bf16 kernels (AVX512-BF16 or AMX); on an AVX2-only CPU it is several times slower than
fp32 (benchmarks/results/precision/2026-12-03-ce922bc.json). On CUDA, bf16 where the device
supports it. An explicit "bfloat16" / true is always honoured.
"""

from __future__ import annotations

import functools

import torch


@functools.cache
def fast_bf16(device_type: str = "cpu") -> bool:
    """Whether bf16 matmuls are fast on this device type."""
    if device_type == "cuda":
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    if device_type != "cpu":
        return False
    return bool(torch.backends.mkldnn.is_available()
                and torch.ops.mkldnn._is_mkldnn_bf16_supported())


def engine_dtype(name: str, device_type: str = "cpu") -> torch.dtype:
    """`model.engine_dtype` ("auto", "bfloat16", "float32") as a torch dtype."""
    if name == "auto":
        return torch.bfloat16 if fast_bf16(device_type) else torch.float32
    return {"bfloat16": torch.bfloat16, "float32": torch.float32}[name]


def autocast_bf16(setting: bool | str, device_type: str = "cpu") -> bool:
    """`trainer.bf16_autocast` (True, False or "auto") resolved for this device type."""
    return fast_bf16(device_type) if setting == "auto" else bool(setting)
