"""LoRA adapters through `peft`: the trainer trains only the adapters; the engine gets either
the merged weights or the adapters alone.

`apply_lora` (models/lora.py, with the other model transforms) injects peft LoRA layers into the policy in place (`peft.inject_adapter_in_model`,
rank / alpha / dropout / target modules from the `lora` section) and freezes every other
parameter, so the trainer's AdamW (built over trainable parameters) holds adapter state only.
The checkpoint (checkpoint.py, unchanged format) saves the model's whole state dict, frozen
base included, and the optimizer, so resuming is exact; it is not an adapter-only file.

What reaches the engine (`lora.sync`), through the run's weight sync (weights/colocated.py:
publisher, codec, transport, subscriber, hash-verified):
- 'merged': `LoraTrainer.export()` returns every tensor under the Hugging Face names the
  engine serves, each adapted linear as W + (alpha / r) B A computed in float32 (then cast to
  the engine dtype by the sync), so any engine that takes weights serves the merged model.
- 'adapter': `export()` returns only `<module>.lora_A.weight` / `.lora_B.weight`;
  `AdapterEngine` wraps the built-in torch engine, keeps a float32 copy of the base weights it
  started from (and their hash), and after each verified update merges
  W = base + (alpha / r) B A with the same arithmetic as the trainer, then hands the merged
  tensors to the wrapped engine. The subscriber verifies the adapter tensors' hash; the base
  copy's hash is checked before every merge; `state_hash()` is the wrapped engine's, over what
  it serves. With a float32 engine the served bits equal the 'merged' path's
  (tests/trainer/test_lora.py); with a bf16 engine the adapters travel in bf16, so the merge
  differs from the merged path's by bf16 rounding of A and B.

QLoRA is not offered: it needs bitsandbytes 4-bit kernels, which this project's CPU platform
does not provide (bitsandbytes' 4-bit quantisation targets CUDA; on CPU it is not supported by
the version range this project can install), so `lora` never quantises the base.
Not covered: LoRA with data-parallel ranks, adapter-only sync to engine processes (async mode)
or to other engines (vLLM's LoRA loading), embedding / lm_head adapters, DoRA, rsLoRA.
"""

from __future__ import annotations

import torch

from traingym.models.lora import (  # noqa: F401 (re-exported: the model transforms)
    adapter_state,
    apply_lora,
    delta,
    lora_layers,
    merged_state,
)
from traingym.trainer.config import LoraConfig
from traingym.trainer.torch_trainer import TorchTrainer


class LoraTrainer(TorchTrainer):
    """TorchTrainer over a LoRA-injected model; `export()` as `lora.sync` asks."""

    def __init__(self, model, *args, lora: LoraConfig, **kwargs):
        self.lora = lora
        super().__init__(apply_lora(model, lora), *args, **kwargs)

    def export(self) -> dict[str, torch.Tensor]:
        if self.lora.sync == "adapter":
            return adapter_state(self.model)
        return merged_state(self.model)


class AdapterEngine:
    """Wraps a TorchEngine: takes adapter tensors, serves base + (alpha / r) B A."""

    def __init__(self, inner, lcfg: LoraConfig):
        from traingym.weights.hashing import state_hash  # heavy: numpy

        self.inner, self.scale = inner, lcfg.alpha / lcfg.rank
        own = inner.model.state_dict()
        self.targets = sorted(n.removesuffix(".weight") for n in own
                              if n.endswith(".weight")
                              and n.split(".")[-2] in set(lcfg.target_modules))
        self.base = {n: own[f"{n}.weight"].detach().float().clone() for n in self.targets}
        self.base_hash = state_hash(self.base)

    def __getattr__(self, name):  # generate, health, abilities, between_steps, model, ...
        return getattr(self.inner, name)

    def __setattr__(self, name, value):
        if name == "between_steps":
            setattr(self.inner, name, value)
        else:
            object.__setattr__(self, name, value)

    def update_weights(self, state: dict[str, torch.Tensor], version: int) -> None:
        """`state`: the verified adapter tensors of every target module."""
        from traingym.weights.hashing import state_hash  # heavy: numpy

        expected = {f"{n}.lora_{x}.weight" for n in self.targets for x in "AB"}
        if set(state) != expected:
            odd = sorted(set(state) ^ expected)[:4]
            raise KeyError(f"AdapterEngine: the adapter state does not match the engine's "
                           f"target modules (differs in {odd}); lora.target_modules must be the "
                           "trainer's")
        if state_hash(self.base) != self.base_hash:
            raise RuntimeError("AdapterEngine: the engine's base weights changed since they were"
                               " copied; the merge would serve the wrong weights")
        dtype = next(iter(self.inner.model.state_dict().values())).dtype
        merged = {f"{n}.weight": (self.base[n] + delta(state[f"{n}.lora_A.weight"],
                                                       state[f"{n}.lora_B.weight"],
                                                       self.scale)).to(dtype)
                  for n in self.targets}
        self.inner.update_weights(merged, version)

    def state_hash(self) -> str:
        return self.inner.state_hash()

    def close(self) -> None:
        self.inner.close()


def wrap_engine(cfg, engine):
    """The engine the run syncs to: wrapped by AdapterEngine under lora.sync='adapter'."""
    if cfg.lora.rank > 0 and cfg.lora.sync == "adapter":
        return AdapterEngine(engine, cfg.lora)
    return engine
