"""Test files have unique basenames: without __init__.py files pytest imports each by its bare
name, and a second file of the same name stops the collection of the whole tree (it happened:
tests/tinker/test_cli.py beside tests/integration/test_cli.py)."""

from collections import Counter
from pathlib import Path


def test_no_two_test_files_share_a_name():
    names = Counter(p.name for p in Path(__file__).parent.rglob("test_*.py"))
    assert [n for n, k in names.items() if k > 1] == []
