"""A toy rollout engine: the built-in torch engine with an option of its own (`log_path`),
where it records each process that built one and each `generate` call. Test-only: proof that
an engine is one file plus one registry line (rollout/registry.py), in sync and async runs.
"""

from __future__ import annotations

import os

from traingym.rollout.torch_engine import TorchEngine


class ToyEngine(TorchEngine):
    class Options(TorchEngine.Options):
        log_path: str | None = None  # the toy's own option (rollout.engine_options.log_path)

    @classmethod
    def from_context(cls, ctx, model, tokenizer, options):
        engine = super().from_context(ctx, model, tokenizer, options)
        engine.log_path = options.log_path
        engine._log(f"built {os.getpid()}")
        return engine

    def _log(self, line: str) -> None:
        if self.log_path:
            with open(self.log_path, "a") as f:
                f.write(line + "\n")

    async def generate(self, requests):
        out = await super().generate(requests)
        self._log(f"generate {os.getpid()} {sum(len(c) for c in out)}")
        return out
