"""Step-level decoding on the built-in engine, for continuous batching (serve/continuous.py).

A `StepDecoder` owns the KV cache rows of a `TorchEngine`'s fused decoder: `admit(requests)`
prefills prompts and adds rows, `step()` samples one token per live row, and rows leave at a stop
token, `max_new_tokens` or `retire(row)`, so a short request never waits for a long one. Rows are
seeded and sampled as in `TorchEngine.generate`, giving what it gives for the request alone (within
float rounding).
Cache: (rows, kv heads, slots, head dim) per layer, live rows first; each row's mask keeps it to its
own slots. Slots grow by half (at least 64) as rows lengthen, so memory follows the lengths decoded;
nothing shrinks.
Not covered: engines without the fused path (HF's DynamicCache has one length for all rows),
in-flight weight updates (`version` is read each step), prefix sharing, paged attention.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from traingym.core.padding import left_pad
from traingym.core.types import GenerationRequest, SamplingParams


@dataclass
class RowToken:
    """One token of one row, as `step()` returns it."""

    row: int  # the row id `admit` returned
    token: int
    logprob: float
    top: list[tuple[int, float]] | None  # (id, log-prob) pairs when top_logprobs > 0
    version: int  # policy version of the weights that computed it
    finish_reason: str | None  # 'stop' (a stop token, this one) or 'length'; None: goes on


@dataclass
class _Row:
    id: int
    params: SamplingParams
    gen: torch.Generator
    stops: frozenset[int]
    made: int = 0
    sample_key: tuple = field(default=())


class StepDecoder:
    def __init__(self, engine, max_rows: int | None = None):
        if engine.fused is None:
            raise ValueError("StepDecoder needs the engine's fused decode path "
                             "(rollout/fused_decoder.py); this model decodes through the plain "
                             "Hugging Face forward, which has no per-row cache slots")
        self.engine, self.fused = engine, engine.fused
        self.max_rows = max_rows or engine.max_batch_rows
        p = self.fused.embed
        self.device = p.device
        self.kv_shape = (self.fused.n_kv, self.fused.head_dim)
        self.cache: list[tuple[torch.Tensor, torch.Tensor]] = []  # (R, KV, S, D) per layer
        self.rows: list[_Row] = []  # live rows, in cache order
        self.logits_B_V: torch.Tensor | None = None  # next-token logits of the live rows
        self.first_B = torch.zeros(0, dtype=torch.long, device=self.device)
        self.slot_B = torch.zeros(0, dtype=torch.long, device=self.device)  # next write slot
        self.next_id = 0

    @property
    def live(self) -> int:
        return len(self.rows)

    def free(self) -> int:
        return self.max_rows - len(self.rows)

    @torch.no_grad()
    def admit(self, requests: list[GenerationRequest]) -> list[list[int]]:
        """Prefill `requests` and add their rows; the row ids of each request's n samples."""
        for i, r in enumerate(requests):
            if r.n < 1 or not r.prompt_ids:
                raise ValueError(f"request {i}: needs n >= 1 and a non-empty prompt")
        ids_P_T, mask_P_T = left_pad([r.prompt_ids for r in requests],
                                     self.engine.pad_token_id, self.device)
        pos_P_T = (mask_P_T.cumsum(-1) - 1).clamp(min=0)
        T = ids_P_T.shape[1]
        logits_P_V, cache = self.fused.prefill(ids_P_T, mask_P_T, pos_P_T, T)
        ns = torch.tensor([r.n for r in requests], device=self.device)
        new = int(ns.sum())
        self._grow(len(self.rows) + new, T + 1)
        lo, hi = len(self.rows), len(self.rows) + new
        for (k, v), (k_new, v_new) in zip(self.cache, cache):
            k[lo:hi, :, :T] = k_new.repeat_interleave(ns, 0)
            v[lo:hi, :, :T] = v_new.repeat_interleave(ns, 0)
        first = (T - mask_P_T.sum(-1)).repeat_interleave(ns)
        self.first_B = torch.cat([self.first_B, first])
        self.slot_B = torch.cat([self.slot_B, torch.full((new,), T, device=self.device)])
        logits = logits_P_V.repeat_interleave(ns, 0)
        self.logits_B_V = logits if self.logits_B_V is None else torch.cat([self.logits_B_V,
                                                                             logits])
        out = []
        for r in requests:
            ids = []
            for k in range(r.n):
                gen = torch.Generator().manual_seed((int(r.seed) * 1_000_003 + k) % (1 << 63))
                p = r.params
                self.rows.append(_Row(self.next_id, p, gen, frozenset(p.stop_token_ids),
                                      sample_key=(p.temperature, p.top_p, p.top_k,
                                                  p.top_logprobs)))
                ids.append(self.next_id)
                self.next_id += 1
            out.append(ids)
        return out

    @torch.no_grad()
    def step(self) -> list[RowToken]:
        """One token for every live row; rows that finish leave; the others run one decode
        forward so the next step has their logits."""
        if not self.rows:
            return []
        version = self.engine.version
        tok_B, lp_B, tops = self._sample()
        out, keep = [], []
        for b, (row, t, lp) in enumerate(zip(self.rows, tok_B.tolist(), lp_B.tolist())):
            row.made += 1
            reason = ("stop" if t in row.stops else
                      "length" if row.made >= row.params.max_new_tokens else None)
            out.append(RowToken(row.id, t, lp, tops[b], version, reason))
            if reason is None:
                keep.append(b)
        if len(keep) < len(self.rows):
            tok_B = tok_B[self._keep(keep)]
        if self.rows:
            n, S = len(self.rows), int(self.slot_B.max()) + 1
            self._grow(n, S)
            view = [(k[:n, :, :S], v[:n, :, :S]) for k, v in self.cache]
            self.logits_B_V = self.fused.decode_rows(tok_B.to(self.device),
                                                     self.slot_B - self.first_B, view,
                                                     self.slot_B, self.first_B)
            self.slot_B = self.slot_B + 1
        return out

    def retire(self, row_ids) -> None:
        """Drop these rows (unknown or finished ids are ignored); their cache places are
        reused."""
        gone = set(row_ids)
        keep = [b for b, r in enumerate(self.rows) if r.id not in gone]
        if len(keep) < len(self.rows):
            self._keep(keep)

    def _sample(self):
        """Tokens, log-probs and per-row top lists, each row group (same temperature, top-p,
        top-k, top_logprobs) sampled by the engine's `_sample`."""
        B = len(self.rows)
        tok_B = torch.zeros(B, dtype=torch.long)
        lp_B = torch.zeros(B)
        tops: list = [None] * B
        groups: dict[tuple, list[int]] = {}
        for b, row in enumerate(self.rows):
            groups.setdefault(row.sample_key, []).append(b)
        for idx in groups.values():
            params = self.rows[idx[0]].params
            logits = self.logits_B_V[idx] if len(idx) < B else self.logits_B_V
            t, lp = self.engine._sample(logits, params, [self.rows[b].gen for b in idx])
            tok_B[idx] = t.cpu()
            if lp.dim() == 2:  # packed: [chosen, k log-probs, k ids]
                k = (lp.shape[-1] - 1) // 2
                for b, ids, lps in zip(idx, lp[:, 1 + k:].long().tolist(),
                                       lp[:, 1:1 + k].tolist()):
                    tops[b] = list(zip(ids, lps))
                lp = lp[:, 0]
            lp_B[idx] = lp.float().cpu()
        return tok_B, lp_B, tops

    def _keep(self, keep: list[int]) -> list[int]:
        """Keep rows `keep` (cache order), moving the last ones into the freed places; the
        new order as old row indices."""
        n = len(keep)
        stay = [b for b in keep if b < n]
        moved = [b for b in keep if b >= n]
        holes = [b for b in range(n) if b not in set(stay)]
        order = list(range(n))
        for hole, b in zip(holes, moved):
            order[hole] = b
        src = torch.tensor(order, dtype=torch.long, device=self.device)
        if moved:
            dst = torch.tensor(holes[:len(moved)], device=self.device)
            srcm = torch.tensor(moved, device=self.device)
            for k, v in self.cache:
                k[dst] = k[srcm]
                v[dst] = v[srcm]
        self.rows = [self.rows[b] for b in order]
        self.first_B, self.slot_B = self.first_B[src], self.slot_B[src]
        self.logits_B_V = self.logits_B_V[src] if n else None
        return order

    def _grow(self, rows: int, slots: int) -> None:
        """Make the cache at least (rows, slots), keeping what the live rows hold."""
        R, S = (self.cache[0][0].shape[0], self.cache[0][0].shape[2]) if self.cache else (0, 0)
        if rows <= R and slots <= S:
            return
        R2 = R if rows <= R else min(max(rows, 2 * R), max(rows, self.max_rows))
        S2 = max(S, slots if slots <= S else max(slots, S + max(S // 2, 64)))
        kw = {"dtype": self.fused.embed.dtype, "device": self.device}
        n = len(self.rows)
        grown = []
        for k, v in self.cache or [(None, None)] * len(self.fused.layers):
            k2 = torch.zeros(R2, *self.kv_shape[:1], S2, self.kv_shape[1], **kw)
            v2 = torch.zeros_like(k2)
            if k is not None and n:
                k2[:n, :, :S] = k[:n]
                v2[:n, :, :S] = v[:n]
            grown.append((k2, v2))
        self.cache = grown
