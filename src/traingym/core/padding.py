"""Batch-row helpers shared by the engine and the trainer: pad ragged token-id rows into (B, T)
id and mask tensors; repeat a prompt's KV-cache rows for its samples."""

from __future__ import annotations

import torch


def left_pad(rows, pad_id: int, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Prompts: real tokens at the right end, so the last column is every row's last token."""
    return _pad(rows, pad_id, device, left=True)


def right_pad(rows, pad_id: int, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Completions: real tokens from the left, padding after them."""
    return _pad(rows, pad_id, device, left=False)


def _pad(rows, pad_id: int, device, left: bool) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(r) for r in rows)
    ids_B_T = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask_B_T = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        cols = slice(width - len(r), width) if left else slice(0, len(r))
        ids_B_T[i, cols] = torch.as_tensor(r, dtype=torch.long)
        mask_B_T[i, cols] = 1
    return ids_B_T.to(device), mask_B_T.to(device)


def repeat_cache_rows(cache, ns: torch.Tensor) -> None:
    """Repeat row p of every layer of a transformers DynamicCache ns[p] times, in place
    (a differentiable repeat, so gradients flow back into the one prompt pass)."""
    for layer in cache.layers:
        layer.keys = layer.keys.repeat_interleave(ns, dim=0)
        layer.values = layer.values.repeat_interleave(ns, dim=0)
