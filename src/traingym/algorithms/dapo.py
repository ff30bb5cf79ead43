"""DAPO: decoupled clip-higher, dynamic sampling, overlong shaping, token-level loss.

Paper: Yu et al. 2025, "DAPO: An Open-Source LLM Reinforcement Learning System at Scale"
(arXiv:2503.14476). Config: `algorithm.name = "dapo"`.

- Clip-higher: clip_low 0.2, clip_high 0.28 (the paper's values).
- Dynamic sampling: groups whose rewards are all equal are filtered out and the step body
  (step.py) samples more prompts until the batch holds rollout.prompts_per_step groups with
  signal, for at most `algorithm.max_sample_rounds` rounds (then it trains short, and the
  step's record says how many rounds it took: `sample_rounds`).
- Soft overlong punishment (eq. 13): with L = rollout.max_new_tokens and buffer C
  (`overlong_buffer`, default L // 5, the paper's 4096 of 20480), a completion of length n in
  (L - C, L] gets (L - C - n) / C x `overlong_penalty` added to its reward.
- Overlong filtering (`overlong_filter`, off by default as in the paper's final recipe, which
  uses the soft punishment instead): truncated samples (finish_reason 'length') carry no loss.
- Token-level policy-gradient loss: the sum over the batch's policy tokens divided by their
  count.

Departures: std normalisation follows traingym's default (off; the paper divides by the
group std: set `normalize_std = true` for that); the refill draws whole new prompts at the
same policy version (async mode: fresh groups from the engines).
"""

from __future__ import annotations

from traingym.algorithms.base import Algorithm


class DAPO(Algorithm):
    name = "dapo"
    DEFAULTS = {"clip_low": 0.2, "clip_high": 0.28, "dynamic_sampling": True,
                "overlong_buffer": "fifth", "overlong_filter": False}
