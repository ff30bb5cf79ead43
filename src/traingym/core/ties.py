"""Tied weights: names of a state that share one tensor (same storage, offset, shape, dtype)."""

from __future__ import annotations


def alias_groups(state: dict, sort: bool = True) -> list[list[str]]:
    """Every name of `state` in a group with the names it shares a tensor with; groups in the
    order of their first name, names in order (sorted, or the state's own with sort=False)."""
    groups: dict[tuple, list[str]] = {}
    for name in sorted(state) if sort else state:
        t = state[name]
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.dtype)
        groups.setdefault(key, []).append(name)
    return list(groups.values())
