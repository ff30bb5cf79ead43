"""Built-in rollout engine: batched sampling on a Hugging Face causal LM with a KV cache.

Each unique prompt is prefilled once and its cache repeated for its n samples, so a group costs one
prefill. Covered families (models/families.py) decode through rollout/fused_decoder.py, others
through the plain HF forward. Every sample draws from its own generator seeded by (request seed,
sample index), so results do not depend on batching. Log-probs are of softmax(logits / T) before the
top-k/top-p cut (greedy: softmax(logits)), as the trainer recomputes them.
In-flight updates: with `between_steps` set, it is called before every decode forward; after a swap
later tokens come from the new weights, each completion records per-token versions, and the earlier
KV cache is kept (as PipelineRL does). Step-level decoding for `traingym serve` is `step_decoder()`
(rollout/continuous.py).
Mixture-of-experts models (models/moe.py: Qwen3-MoE, Mixtral, Qwen2-MoE; rollout/fused_moe.py): each
completion carries its routes (`Completion.routes`: the experts of each MoE layer at every prompt
and completion position the engine ran), for routing replay in the trainer.
Not covered: stop strings (stop token ids only), speculative decoding, paged attention.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
from typing import Callable

import torch
from pydantic import BaseModel, ConfigDict, Field
from transformers import DynamicCache

from traingym.core.padding import left_pad, repeat_cache_rows
from traingym.core.precision import engine_dtype
from traingym.core.types import Completion, GenerationRequest, SamplingParams
from traingym.models import moe
from traingym.models.scoring import contiguous_head_input, row_logits, token_logprobs
from traingym.rollout.base import EngineAbilities
from traingym.rollout.continuous import StepDecoder
from traingym.rollout.fused_decoder import FusedDecoder, supports


def _filter_logits(logits_B_V: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Apply top-k then top-p to temperature-scaled logits (cut entries become -inf)."""
    if params.top_k > 0 and params.top_k < logits_B_V.shape[-1]:
        kth = torch.topk(logits_B_V, params.top_k, dim=-1).values[:, -1:]
        logits_B_V = logits_B_V.masked_fill(logits_B_V < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_B_V, order_B_V = torch.sort(logits_B_V, descending=True, dim=-1)
        cum_B_V = sorted_B_V.softmax(-1).cumsum(-1)
        cut_B_V = cum_B_V - sorted_B_V.softmax(-1) >= params.top_p  # keep the first token always
        sorted_B_V = sorted_B_V.masked_fill(cut_B_V, float("-inf"))
        logits_B_V = torch.empty_like(logits_B_V).scatter_(-1, order_B_V, sorted_B_V)
    return logits_B_V


def draw(logits_B_V: torch.Tensor, gens: list[torch.Generator]) -> torch.Tensor:
    """One token per row from softmax(logits), by inverting the row's CDF (float64) at one
    uniform draw from the row's own generator. One random number per row and step (an
    exponential race would need a vocabulary's worth); u lies in (0, 1], so a token of
    probability 0 (cut by top-k / top-p) is never drawn."""
    cdf_B_V = logits_B_V.softmax(-1).double().cumsum(-1)
    u_B = 1.0 - torch.cat([torch.rand(1, generator=g, dtype=torch.float64) for g in gens])
    x_B_1 = u_B.to(cdf_B_V.device)[:, None] * cdf_B_V[:, -1:]
    return torch.searchsorted(cdf_B_V, x_B_1)[:, 0].clamp(max=logits_B_V.shape[-1] - 1)


class TorchEngine:
    """Rollout engine over an in-process `transformers` model (eval mode, no grad)."""

    class Options(BaseModel):
        model_config = ConfigDict(extra="forbid")
        fused: bool = Field(True, description="the fused decode path where the architecture "
                            "allows it (rollout/fused_decoder.py); False: the plain HF forward")
        score_tokens: int = Field(8192, ge=1, description="padded tokens (rows x (longest "
                                  "prompt + longest completion)) one `score` forward takes; "
                                  "its fp32 logits are about 4 x vocab bytes per completion "
                                  "token")

    abilities = EngineAbilities(takes_weights=True, inflight_updates=True,
                                crosses_processes=True, scores_tokens=True,
                                scores_at_any_temperature=True, reports_routes=True)

    @classmethod
    def from_context(cls, ctx, model, tokenizer, options: Options) -> TorchEngine:
        """A copy of `model` in `ctx.dtype`, decoding `ctx.max_batch_rows` rows at once."""
        return cls(copy.deepcopy(model), tokenizer.pad_token_id, ctx.max_batch_rows,
                   engine_dtype(ctx.dtype), fused=options.fused,
                   score_tokens=options.score_tokens)

    def __init__(self, model, pad_token_id: int, max_batch_rows: int = 64, dtype=None,
                 fused: bool = True, score_tokens: int = 8192):
        self.model = model.eval()
        if dtype is not None:
            self.model.to(dtype)
        self.dtype = next(self.model.parameters()).dtype
        self.pad_token_id = pad_token_id
        self.max_batch_rows = max_batch_rows
        self.score_tokens = score_tokens  # padded tokens per `score` forward (Options)
        self.version = 0
        # Called between decode steps (in the decoding thread) where set: it may call
        # update_weights, and later tokens record the new version (in-flight updates).
        self.between_steps: Callable[[], None] | None = None
        # The fused decode path (rollout/fused_decoder.py) where the architecture allows it.
        self.fused = FusedDecoder(self.model) if fused and supports(self.model) else None
        self.records_routes = bool(moe.routers(self.model))  # MoE: each sample's routes
        # per instance: step-level decoding (continuous batching) needs the fused path
        self.abilities = dataclasses.replace(TorchEngine.abilities,
                                             step_decoding=self.fused is not None)

    def step_decoder(self, max_rows: int | None = None):
        """A rollout/continuous.py StepDecoder over this engine (rows up to `max_rows`,
        default `max_batch_rows`); only where `abilities.step_decoding`."""

        return StepDecoder(self, max_rows)

    async def score(self, prompts: list[list[int]], completions: list[list[int]],
                    temperature: float) -> list[list[float]]:
        """rollout/base.py's `score`, in a worker thread: one plain HF forward over prompt +
        completion per row, log softmax(logits / T) in fp32 as the trainer computes it
        (scoring.py). Forwards hold at most `max_batch_rows` rows and `score_tokens` padded
        tokens (a larger row runs alone); an empty completion scores as []."""
        if len(prompts) != len(completions) or not all(prompts):
            raise ValueError(f"score: {len(prompts)} prompts for {len(completions)} "
                             "completions; each row needs a non-empty prompt")
        return await asyncio.to_thread(self._score, prompts, completions, temperature)

    def _score_chunks(self, prompts, completions) -> list[list[int]]:
        """Row indices (non-empty completions, in order) per forward, within the row and
        token budgets."""
        chunks: list[list[int]] = []
        chunk: list[int] = []
        longest_p = longest_c = 0
        for i, c in enumerate(completions):
            if not c:
                continue
            p, cc = max(longest_p, len(prompts[i])), max(longest_c, len(c))
            if chunk and (len(chunk) == self.max_batch_rows
                          or (len(chunk) + 1) * (p + cc) > self.score_tokens):
                chunks.append(chunk)
                chunk, p, cc = [], len(prompts[i]), len(c)
            chunk.append(i)
            longest_p, longest_c = p, cc
        return chunks + [chunk] if chunk else chunks

    @torch.no_grad()
    def _score(self, prompts, completions, temperature: float) -> list[list[float]]:
        out: list[list[float]] = [[] for _ in prompts]
        for idx in self._score_chunks(prompts, completions):
            logits_B_C_V, comp_B_C, _ = row_logits(self.model, [prompts[i] for i in idx],
                                                   [completions[i] for i in idx],
                                                   self.pad_token_id)
            logp_B_C = token_logprobs(logits_B_C_V, comp_B_C, temperature)
            del logits_B_C_V
            for i, row in zip(idx, logp_B_C.tolist()):
                out[i] = row[: len(completions[i])]
        return out

    def writable_state(self) -> dict[str, torch.Tensor]:
        """The model's own tensors as the wire names them (colocated.wire_views), for a same-process
        subscriber to apply verified updates into in place, with no copy of the model beside the
        engine's."""
        from traingym.weights.colocated import wire_views  # heavy: numpy, zstandard

        return wire_views(self.model.state_dict())

    def release_derived(self) -> None:
        """Drop what the engine rebuilds on its own (the fused decoder's weights: a copy of the
        model where pre-packing pays) while a colocated trainer runs; the next update or
        generate rebuilds it."""
        if self.fused is not None:
            self.fused.release()

    def update_weights(self, state: dict[str, torch.Tensor], version: int) -> None:
        own = self.model.state_dict()  # tensors share storage with the model's parameters
        unknown = sorted(set(state) - set(own))
        if unknown:
            raise KeyError(f"update_weights: the engine's model has no tensors {unknown[:5]}")
        with torch.no_grad():
            for name, tensor in state.items():
                o = own[name]
                if (tensor.data_ptr(), tensor.shape, tensor.stride(), tensor.dtype) == \
                        (o.data_ptr(), o.shape, o.stride(), o.dtype):
                    continue  # written in place already (writable_state)
                own[name].copy_(tensor)
        if self.fused is not None:
            self.fused.refresh()
        self.version = version

    def state_hash(self) -> str:
        """The hash of the engine model's own tensors, cast as the wire sends them."""
        from traingym.weights.colocated import wire_state  # heavy: numpy, zstandard
        from traingym.weights.hashing import state_hash  # heavy: numpy

        return state_hash(wire_state(self.model.state_dict(), self.dtype))

    def health(self) -> dict:
        return {"ok": True, "version": self.version}

    def close(self) -> None:
        """Nothing to release beyond the model, which the garbage collector frees."""

    async def generate(self, requests: list[GenerationRequest]) -> list[list[Completion]]:
        """In a worker thread, so the caller's event loop (env steps, sandbox pipes and their
        timeouts) keeps running while the model decodes."""
        return await asyncio.to_thread(self.generate_sync, requests)

    def generate_sync(self, requests: list[GenerationRequest]) -> list[list[Completion]]:
        out: list[list[Completion]] = [[] for _ in requests]
        by_params: dict[SamplingParams, list[int]] = {}
        for i, r in enumerate(requests):
            if r.n < 1:
                raise ValueError(f"request {i}: n must be >= 1, got {r.n}")
            if not r.prompt_ids:
                raise ValueError(f"request {i}: empty prompt")
            by_params.setdefault(r.params, []).append(i)
        for params, idxs in by_params.items():
            chunk: list[int] = []
            rows = 0
            for i in idxs + [None]:
                if i is not None and (rows + requests[i].n <= self.max_batch_rows or not chunk):
                    chunk.append(i)
                    rows += requests[i].n
                    continue
                for j, comps in zip(chunk, self._run([requests[k] for k in chunk], params)):
                    out[j] = comps
                if i is not None:
                    chunk, rows = [i], requests[i].n
        return out

    @torch.no_grad()
    def _run(self, requests: list[GenerationRequest], params: SamplingParams):
        if not self.records_routes:
            return self._decode(requests, params)
        if self.fused is not None:  # it records the experts it chose
            self.fused.routes = []
            try:
                out = self._decode(requests, params)
            finally:
                calls, self.fused.routes = self.fused.routes, None
        else:
            with moe.routing(self.model) as log:
                out = self._decode(requests, params)
            calls = log.chosen
        routes = iter(moe.engine_routes(calls, [len(r.prompt_ids) for r in requests],
                                        [r.n for r in requests],
                                        [len(c.token_ids) for cs in out for c in cs]))
        for comps in out:
            for c in comps:
                c.routes = next(routes)
        return out

    def _decode(self, requests: list[GenerationRequest], params: SamplingParams):
        device = next(self.model.parameters()).device
        ids_P_T, mask_P_T = left_pad([r.prompt_ids for r in requests], self.pad_token_id, device)
        pos_P_T = (mask_P_T.cumsum(-1) - 1).clamp(min=0)
        ns = torch.tensor([r.n for r in requests], device=device)
        logits_P_V, forward = self._prefill(ids_P_T, mask_P_T, pos_P_T, ns, params.max_new_tokens)
        logits_B_V = logits_P_V.repeat_interleave(ns, dim=0)
        mask_B_T = mask_P_T.repeat_interleave(ns, dim=0)
        next_pos_B = pos_P_T[:, -1].repeat_interleave(ns, dim=0) + 1
        gens = [
            torch.Generator().manual_seed((int(r.seed) * 1_000_003 + k) % (1 << 63))
            for r in requests for k in range(r.n)
        ]
        B = logits_B_V.shape[0]
        stop = torch.tensor(sorted(params.stop_token_ids), dtype=torch.long, device=device)
        tokens, logps, versions = [], [], []
        alive_B = torch.ones(B, dtype=torch.bool, device=device)
        for step in range(params.max_new_tokens):
            versions.append(self.version)  # of the weights that computed these logits
            tok_B, lp_B = self._sample(logits_B_V, params, gens)
            tok_B = torch.where(alive_B, tok_B, torch.full_like(tok_B, self.pad_token_id))
            tokens.append(tok_B)
            logps.append(lp_B)
            alive_next = alive_B & ~torch.isin(tok_B, stop) if stop.numel() else alive_B
            if step == params.max_new_tokens - 1 or not alive_next.any():
                alive_B = alive_next
                break
            mask_B_T = torch.cat([mask_B_T, alive_B.long()[:, None]], dim=1)
            if self.between_steps is not None:
                self.between_steps()
            logits_B_V = forward(tok_B, next_pos_B, mask_B_T)
            next_pos_B = next_pos_B + 1
            alive_B = alive_next
        return self._collect(requests, torch.stack(tokens, 1), torch.stack(logps, 1), stop,
                             versions)

    def _prefill(self, ids_P_T, mask_P_T, pos_P_T, ns, max_new_tokens: int):
        """Prefill each prompt once, repeat its cache per sample; return logits and a step fn."""
        if self.fused is not None:
            logits, cache = self.fused.prefill(ids_P_T, mask_P_T, pos_P_T,
                                               ids_P_T.shape[1] + max_new_tokens)
            cache = [(k.repeat_interleave(ns, 0), v.repeat_interleave(ns, 0)) for k, v in cache]

            def forward(tok_B, pos_B, mask_B_S):
                return self.fused.decode(tok_B, pos_B, cache, mask_B_S.shape[1] - 1, mask_B_S)

            return logits, forward
        cache = DynamicCache()
        with contiguous_head_input(self.model):  # models/scoring.py: else P copies of the head
            logits = self.model(
                input_ids=ids_P_T, attention_mask=mask_P_T, position_ids=pos_P_T,
                cache=cache, use_cache=True, logits_to_keep=1,
            ).logits[:, -1].float()
        repeat_cache_rows(cache, ns)

        def forward(tok_B, pos_B, mask_B_S):
            return self.model(input_ids=tok_B[:, None], attention_mask=mask_B_S,
                              position_ids=pos_B[:, None], cache=cache,
                              use_cache=True).logits[:, -1].float()

        return logits, forward

    def _sample(self, logits_B_V, params: SamplingParams, gens):
        """(token, log-prob) per row. With `params.top_logprobs` = k > 0 the log-prob row is
        packed as (B, 1 + 2k): [chosen, k top log-probs, k top ids as floats (exact below
        2**24)], so _run stacks it unchanged and _collect unpacks it."""
        if params.temperature == 0:
            lp_B_V = logits_B_V.log_softmax(-1)
            tok_B = lp_B_V.argmax(-1)
        else:
            scaled_B_V = logits_B_V / params.temperature
            lp_B_V = scaled_B_V.log_softmax(-1)
            tok_B = draw(_filter_logits(scaled_B_V, params), gens)
        lp_B = lp_B_V.gather(-1, tok_B[:, None])[:, 0]
        if params.top_logprobs <= 0:
            return tok_B, lp_B
        top = torch.topk(lp_B_V, min(params.top_logprobs, lp_B_V.shape[-1]), dim=-1)
        return tok_B, torch.cat([lp_B[:, None], top.values, top.indices.float()], dim=-1)

    def _collect(self, requests, tokens_B_N, logps_B_N, stop, versions):
        out, row = [], 0
        top_B_N_K = None
        if logps_B_N.dim() == 3:  # packed by _sample: [chosen, k log-probs, k ids]
            k = (logps_B_N.shape[-1] - 1) // 2
            top_B_N_K = list(zip(logps_B_N[..., 1 + k:].long().tolist(),
                                 logps_B_N[..., 1:1 + k].tolist()))
            logps_B_N = logps_B_N[..., 0]
        tokens, logps = tokens_B_N.tolist(), logps_B_N.tolist()
        stops = set(stop.tolist())
        for r in requests:
            comps = []
            for _ in range(r.n):
                ids, lps, reason = [], [], "length"
                for t, lp in zip(tokens[row], logps[row]):
                    ids.append(t)
                    lps.append(lp)
                    if t in stops:
                        reason = "stop"
                        break
                own = versions[: len(ids)]
                comps.append(Completion(tuple(r.prompt_ids), ids, lps, reason, own[0],
                                        own if own[0] != own[-1] else None))
                if top_B_N_K is not None:
                    top_ids, top_lps = top_B_N_K[row]
                    comps[-1].top_logprobs = [list(zip(i, lp)) for i, lp in
                                              zip(top_ids[: len(ids)], top_lps[: len(ids)])]
                row += 1
            out.append(comps)
        return out

