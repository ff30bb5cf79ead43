"""LoRA adapters through `peft`: the trainer trains only the adapters; the engine gets either
the merged weights or the adapters alone.

`apply_lora` (models/lora.py) injects the adapters and freezes every other parameter, so AdamW
holds adapter state only; checkpoints (runs/checkpoint.py) hold the whole state dict, so
resuming is exact. `lora.sync` picks what the weight sync sends: 'merged', every tensor with
each adapted linear as W + (alpha / r) B A in float32; or 'adapter', only the A and B tensors,
which `AdapterEngine` merges into its copy of the base (the engine's dtype, hash-checked)
with the same arithmetic (the same bits as 'merged' on a float32 engine; bf16 rounding of A and
B on bf16). `lora.base_dtype` 'bfloat16' keeps the frozen base in bf16 (the run loads it so:
loop/build.py, and the engine's copy is made from it); the adapters and AdamW's state stay
float32, and the merge upcasts W first. peft creates adapters in the base's dtype, so with a bf16
base lora_A starts from its init rounded to bf16. Under 'adapter' sync nothing ever writes the
base outside the A and B tensors (the trainer keeps it frozen; the engine is sent the adapted
layers only), so where the engine's dtype is the base's, the engine's other tensors and
AdapterEngine's copy of the adapted layers' bases are the trainer's own (`share_frozen`): one
copy of the frozen base instead of two.
QLoRA is not offered: bitsandbytes' 4-bit kernels target CUDA, not this CPU platform.
Not covered: LoRA with data-parallel ranks, adapter-only sync to engine processes (async mode)
or to other engines (vLLM's LoRA loading), embedding / lm_head adapters, DoRA, rsLoRA.
"""

from __future__ import annotations

import torch

from traingym.core.precision import autocast_bf16
from traingym.models.lora import (
    adapter_state,
    apply_lora,
    delta,
    merged_state,
    set_dtypes,
)
from traingym.trainer.config import LoraConfig, TrainerConfig
from traingym.trainer.torch_trainer import TorchTrainer


def base_dtype(lora: LoraConfig, trainer: TrainerConfig, device_type: str = "cpu") -> torch.dtype:
    """`lora.base_dtype` as a torch dtype; 'auto': bf16 where trainer.bf16_autocast is on."""
    name = lora.base_dtype
    if name == "auto":
        name = "bfloat16" if autocast_bf16(trainer.bf16_autocast, device_type) else "float32"
    return {"bfloat16": torch.bfloat16, "float32": torch.float32}[name]


class LoraTrainer(TorchTrainer):
    """TorchTrainer over a LoRA-injected model; `export()` as `lora.sync` asks."""

    def __init__(self, model, cfg: TrainerConfig, *args, lora: LoraConfig, **kwargs):
        self.lora = lora
        device = next(model.parameters()).device.type
        model = apply_lora(model, lora)
        set_dtypes(model, base_dtype(lora, cfg, device))  # before AdamW sees the adapters
        super().__init__(model, cfg, *args, **kwargs)

    def lend(self, lender) -> None:
        """Nothing to borrow: the engine serves W + BA, not the casts of the frozen W."""

    def export(self) -> dict[str, torch.Tensor]:
        if self.lora.sync == "adapter":
            return adapter_state(self.model)
        return merged_state(self.model)


class AdapterEngine:
    """Wraps a TorchEngine: takes adapter tensors, serves base + (alpha / r) B A."""

    def __init__(self, inner, lcfg: LoraConfig, base_model=None):
        """`base_model`: the model the trainer injects adapters into (before injection); its
        target weights serve as the base where they have the engine's dtype (no copy)."""
        from traingym.weights.hashing import state_hash  # heavy: numpy

        self.inner, self.scale = inner, lcfg.alpha / lcfg.rank
        own = inner.model.state_dict()
        self.targets = sorted(n.removesuffix(".weight") for n in own
                              if n.endswith(".weight")
                              and n.split(".")[-2] in set(lcfg.target_modules))
        theirs = base_model.state_dict() if base_model is not None else {}
        # in the engine's dtype (exact: its own values), upcast one at a time to merge
        self.base = {}
        for n in self.targets:
            mine = _same(theirs.get(f"{n}.weight"), own[f"{n}.weight"])
            self.base[n] = mine if mine is not None else own[f"{n}.weight"].detach().clone()
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
        merged = {f"{n}.weight": (self.base[n].float() + delta(state[f"{n}.lora_A.weight"],
                                                       state[f"{n}.lora_B.weight"],
                                                       self.scale)).to(dtype)
                  for n in self.targets}
        self.inner.update_weights(merged, version)

    def state_hash(self) -> str:
        return self.inner.state_hash()

    def close(self) -> None:
        self.inner.close()


def _same(mine: torch.Tensor | None, engine: torch.Tensor) -> torch.Tensor | None:
    """`mine` (detached) where it can stand in for the engine's tensor: same dtype and shape."""
    if mine is None or mine.dtype != engine.dtype or mine.shape != engine.shape:
        return None
    return mine.detach()


def share_frozen(engine_model, base_model, target_modules) -> int:
    """Point each parameter of `engine_model` outside the `target_modules` layers at
    `base_model`'s tensor of the same name, dtype and shape (tied ones once); returns the bytes
    the engine no longer holds. Only for adapter sync: nothing may write these tensors (the
    fused decoder's copies still reference the old ones until its next refresh, which the first
    weight update does)."""
    theirs = dict(base_model.named_parameters())
    freed = 0
    with torch.no_grad():
        for name, p in engine_model.named_parameters():
            if name.split(".")[-2] in set(target_modules):
                continue
            mine = _same(theirs.get(name), p)
            if mine is not None and mine.data_ptr() != p.data_ptr():
                freed += p.numel() * p.element_size()
                p.data = mine
    return freed


def wrap_engine(lora, engine, base_model=None):
    """The engine the run syncs to: wrapped by AdapterEngine under lora.sync='adapter', its
    frozen tensors then `base_model`'s where they can be (`share_frozen`)."""
    if lora.rank > 0 and lora.sync == "adapter":
        if base_model is not None:
            share_frozen(engine.model, base_model, lora.target_modules)
        return AdapterEngine(engine, lora, base_model)
    return engine
