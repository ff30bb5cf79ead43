"""LoRA as a model transform through `peft`: inject adapters, read them out, merge them.

These act on a model only (no trainer, no config section): `apply_lora` takes any object with
`rank`, `alpha`, `dropout` and `target_modules` (the `lora` config section, or a `LoraShape`
read from a run's config.json), so loading a LoRA run's checkpoint (models/spec.py) and
training one (trainer/lora.py) inject the same layers and merge with the same arithmetic:
W + (alpha / r) B A in float32. `peft` is imported only when adapters are injected or read.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class LoraShape:
    """The adapter settings a model transform needs (the `lora` section's defaults)."""

    rank: int = 0
    alpha: float = 16.0
    dropout: float = 0.0
    target_modules: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj")


def apply_lora(model, lcfg):
    """Inject LoRA layers into `model` in place; only adapter parameters stay trainable."""
    try:
        from peft import LoraConfig as PeftLoraConfig
        from peft import inject_adapter_in_model
    except ModuleNotFoundError:
        raise ModuleNotFoundError("lora.rank > 0 needs the `peft` package: pip install "
                                  "'traingym[lora]' (or pip install peft)") from None
    linear_names = {name.rsplit(".", 1)[-1] for name, m in model.named_modules()
                    if isinstance(m, torch.nn.Linear)}
    missing = sorted(set(lcfg.target_modules) - linear_names)
    if missing:
        raise ValueError(f"lora.target_modules {missing} name no linear layer of this model; "
                         f"its linear layers are {sorted(linear_names)}")
    peft_cfg = PeftLoraConfig(r=lcfg.rank, lora_alpha=lcfg.alpha, lora_dropout=lcfg.dropout,
                              target_modules=list(lcfg.target_modules), bias="none")
    model = inject_adapter_in_model(peft_cfg, model)
    for name, p in model.named_parameters():
        p.requires_grad_(".lora_" in name)
    return model


def set_dtypes(model, base_dtype: torch.dtype) -> None:
    """In place: every non-adapter parameter in `base_dtype`, every adapter parameter (lora_A,
    lora_B) in float32 (peft creates adapters in the base's dtype). Buffers (rotary
    frequencies) and tied parameters (one Parameter) are left as they are; a no-op where the
    dtypes already match."""
    for name, p in model.named_parameters():
        dtype = torch.float32 if ".lora_" in name else base_dtype
        if p.dtype != dtype:
            p.data = p.data.to(dtype)


def lora_layers(model) -> dict[str, torch.nn.Module]:
    """module name -> peft LoRA layer."""
    from peft.tuners.lora import LoraLayer

    return {name: m for name, m in model.named_modules() if isinstance(m, LoraLayer)}


def delta(a: torch.Tensor, b: torch.Tensor, scale: float) -> torch.Tensor:
    """(alpha / r) B A in float32: the one formula both the trainer and the engine use."""
    return (b.float() @ a.float()) * scale


def adapter_state(model) -> dict[str, torch.Tensor]:
    """Only the adapters: `<module>.lora_A.weight`, `<module>.lora_B.weight`."""
    out = {}
    for name, layer in lora_layers(model).items():
        out[f"{name}.lora_A.weight"] = layer.lora_A["default"].weight.detach()
        out[f"{name}.lora_B.weight"] = layer.lora_B["default"].weight.detach()
    return out


def merged_state(model) -> dict[str, torch.Tensor]:
    """Every tensor under the base model's names; adapted linears merged in float32 (from a
    bf16 base too: W upcast, then + (alpha / r) B A), the others in the base's dtype."""
    out = {k.replace(".base_layer.", "."): v.detach() for k, v in model.state_dict().items()
           if ".lora_" not in k}
    for name, layer in lora_layers(model).items():
        base = layer.base_layer.weight.detach()
        out[f"{name}.weight"] = base.float() + delta(layer.lora_A["default"].weight.detach(),
                                                     layer.lora_B["default"].weight.detach(),
                                                     layer.scaling["default"])
    return out
