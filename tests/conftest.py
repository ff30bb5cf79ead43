"""Shared test set-up. tests/ is on sys.path (pytest's prepend import mode), so tests import
their helpers as modules: prereq (a missing package or sandbox backend skips locally and
fails under CI=true), dp_batches."""

import os

import pytest
import torch

torch.set_num_threads(min(2, os.cpu_count() or 1))


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory, monkeypatch):
    """Runs write under tmp; the embedded model cache stays shared (it is expensive)."""
    monkeypatch.chdir(tmp_path_factory.mktemp("cwd"))
