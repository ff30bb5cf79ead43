"""DAPO: decoupled clip-higher, dynamic sampling, overlong shaping, token-level loss.

Paper: Yu et al. 2025, "DAPO: An Open-Source LLM Reinforcement Learning System at Scale"
(arXiv:2503.14476). Config: `algorithm.name = "dapo"`. Clip-higher 0.2 / 0.28 (the paper's).
Dynamic sampling: groups with all-equal rewards are filtered out and loop/step.py samples more
prompts, for at most `algorithm.max_sample_rounds` rounds (then trains short; `sample_rounds`).
Soft overlong punishment (eq. 13) over a buffer `overlong_buffer` (default max_new_tokens // 5);
overlong filtering (`overlong_filter`) off by default, as in the paper's final recipe.

Departures: std normalisation off by default (the paper divides by the group std:
`normalize_std = true`); the refill draws new prompts at the same policy version (async mode:
fresh groups from the engines).
"""

from __future__ import annotations

from traingym.algorithms.base import Algorithm


class DAPO(Algorithm):
    name = "dapo"
    DEFAULTS = {"clip_low": 0.2, "clip_high": 0.28, "dynamic_sampling": True,
                "overlong_buffer": "fifth", "overlong_filter": False}
