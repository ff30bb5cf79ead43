"""A read-only engine for eval tests: it answers each prompt with fixed text, so a test knows
what every sample scores. Sample j of a request gets `ANSWERS[j % len(ANSWERS)]` (tokenized with
the run's tokenizer); log-probs are 0.0. Named in tests as "scripted_engine:ScriptedEngine"
(tests/eval is on sys.path)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from traingym.rollout.base import EngineAbilities
from traingym.core.types import Completion, GenerationRequest

# pre-filled with "```python\ndef add(": a right and a wrong body
ANSWERS = ["a, b):\n    return a + b\n```", "a, b):\n    return a - b\n```"]


class ScriptedEngine:
    class Options(BaseModel):
        model_config = ConfigDict(extra="forbid")

    abilities = EngineAbilities(takes_weights=False, inflight_updates=False,
                                crosses_processes=False)

    @classmethod
    def from_context(cls, ctx, model, tokenizer, options):
        assert model is None  # a read-only engine is given no model (eval/specs.py)
        return cls(tokenizer)

    def __init__(self, tokenizer):
        self.tok, self.version, self.between_steps = tokenizer, 0, None

    async def generate(self, requests: list[GenerationRequest]) -> list[list[Completion]]:
        out = []
        for r in requests:
            comps = []
            for j in range(r.n):
                ids = self.tok.encode(ANSWERS[j % len(ANSWERS)], add_special_tokens=False)
                ids = ids[: r.params.max_new_tokens]
                comps.append(Completion(tuple(r.prompt_ids), ids, [0.0] * len(ids), "length", 0))
            out.append(comps)
        return out

    def update_weights(self, state, version):
        raise RuntimeError("read-only")

    def state_hash(self):
        raise RuntimeError("read-only")

    def health(self):
        return {"ok": True}

    def close(self):
        pass
