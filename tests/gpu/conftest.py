"""tests/gpu: everything here needs a CUDA device. Without one every test collected from this
folder (and any test marked `gpu`) is skipped with that reason: a legitimate skip everywhere,
CI included (CI has no GPU; scripts/gpu_check.sh runs these on a lent GPU machine)."""

from pathlib import Path

import pytest
import torch

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (tests/gpu; run scripts/gpu_check.sh "
                            "on a GPU machine)")
    for item in items:
        if HERE in Path(str(item.fspath)).resolve().parents or item.get_closest_marker("gpu"):
            item.add_marker(skip)
