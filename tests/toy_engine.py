"""A second engine behind the seam, written the way a user would add one: one class here plus
one registry line (or a "module:Class" path in `rollout.engine`).

`RecomputeEngine` keeps no KV cache: every decode step runs the whole sequence through the
Hugging Face forward and samples the last position with torch.multinomial from a generator
per sample. Slow and simple, so its log-probs are exactly what the trainer recomputes; it
shares no code with the built-in engine's decoding.
"""

from __future__ import annotations

import asyncio
import copy
import os

import torch
from pydantic import BaseModel, ConfigDict

from traingym.core.precision import engine_dtype
from traingym.rollout.base import EngineAbilities
from traingym.core.types import Completion, GenerationRequest
from traingym.weights.colocated import wire_state
from traingym.weights.hashing import state_hash


class RecomputeEngine:
    class Options(BaseModel):
        model_config = ConfigDict(extra="forbid")

    abilities = EngineAbilities(takes_weights=True, inflight_updates=False,
                                crosses_processes=True)

    @classmethod
    def from_context(cls, ctx, model, tokenizer, options):
        if os.environ.get("TOY_ENGINE_LOG"):  # tests read which processes built one
            with open(os.environ["TOY_ENGINE_LOG"], "a") as f:
                f.write(f"{os.getpid()}\n")
        return cls(copy.deepcopy(model).to(engine_dtype(ctx.dtype)), tokenizer)

    def __init__(self, model, tokenizer):
        self.model, self.tok = model.eval(), tokenizer
        self.version, self.between_steps, self.calls = 0, None, 0

    def update_weights(self, state, version):
        own = self.model.state_dict()
        with torch.no_grad():
            for name, t in state.items():
                own[name].copy_(t)
        self.version = version

    def state_hash(self):
        return state_hash(wire_state(self.model.state_dict(), self.model.dtype))

    def health(self):
        return {"ok": True, "version": self.version}

    def close(self):
        pass

    async def generate(self, requests: list[GenerationRequest]) -> list[list[Completion]]:
        self.calls += 1
        return await asyncio.to_thread(lambda: [self._one(r) for r in requests])

    @torch.no_grad()
    def _one(self, r: GenerationRequest) -> list[Completion]:
        p, out = r.params, []
        for k in range(r.n):
            gen = torch.Generator().manual_seed((r.seed * 7919 + k) % (1 << 63))
            ids, lps, reason = list(r.prompt_ids), [], "length"
            for _ in range(p.max_new_tokens):
                logits = self.model(torch.tensor([ids])).logits[0, -1].float()
                lp = (logits / p.temperature if p.temperature > 0 else logits).log_softmax(-1)
                tok = (int(lp.argmax()) if p.temperature == 0
                       else int(torch.multinomial(lp.exp(), 1, generator=gen)))
                ids.append(tok)
                lps.append(float(lp[tok]))
                if tok in p.stop_token_ids:
                    reason = "stop"
                    break
            out.append(Completion(tuple(r.prompt_ids), ids[len(r.prompt_ids):], lps, reason,
                                  self.version))
        return out
