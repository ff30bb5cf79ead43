"""The trainer's optimizer: AdamW over the trainable parameters, exact (torch's; the default) or
with 8-bit moments (`trainer.optimizer = "adamw_8bit"`), stepped after the backward pass or
inside it (`trainer.optimizer_in_backward`: `StepInBackward`).

adamw_8bit is bitsandbytes' AdamW8bit (the `memory` extra): both moments block-wise quantized
(256 values a block, dynamic 8-bit map; tensors under 4096 values keep fp32 moments), so an
approximation of AdamW. Chosen over torchao's AdamW8bit: on a CPU it steps faster and compiles
nothing, and its state is plain tensors that checkpoints hold as they are (figures:
benchmarks/optimizer_8bit.py). Both are far slower than fused fp32 AdamW on a CPU: the option
saves memory (of a GPU, mostly), not time.
Not covered: 8-bit moments with data-parallel ranks, paged optimizers, 4-bit moments.
"""

from __future__ import annotations

import functools
import logging

import torch

from traingym.core import memory
from traingym.trainer.config import TrainerConfig

QMAPS = ("qmap1", "qmap2")  # bitsandbytes' quantization maps: constants shared by all tensors
# StepInBackward returns the heap's free pages before stepping a parameter this large: the step's
# temporaries (fp32 copies of its moments, for 8-bit AdamW) would otherwise land beside the
# activations the backward pass has freed but the heap still holds (Llama-3.2-1B shape, where
# only its tied embedding is this large: 21.43 GB peak without, 18.78 GB with; big_models.py).
TRIM_BEFORE_STEP_BYTES = 256 << 20


def make_optimizer(model, cfg: TrainerConfig, value_head=None,
                   value_lr_scale: float = 1.0) -> torch.optim.Optimizer:
    """AdamW (`cfg.optimizer`) over the trainable parameters, in `model.parameters()` order (a
    checkpoint's optimizer state is keyed by that order); a value head's parameters after them,
    in a group of their own with lr x `value_lr_scale` (the group's `lr_scale`). For 'adamw',
    torch's fused kernel where every parameter is a plain floating tensor (several times faster
    than foreach on a CPU: benchmarks/optimizer_step.py), else foreach (sharded DTensors)."""
    groups = [{"params": [p for p in model.parameters() if p.requires_grad]}]
    if value_head is not None:
        groups.append({"params": list(value_head.parameters()), "lr": cfg.lr * value_lr_scale,
                       "lr_scale": value_lr_scale})
    if cfg.optimizer == "adamw_8bit":
        return adamw_8bit_class()(groups, lr=cfg.lr, betas=cfg.betas,
                                  weight_decay=cfg.weight_decay)
    params = [p for g in groups for p in g["params"]]
    fused = all(type(p.data) is torch.Tensor and p.is_floating_point() for p in params)
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay,
                             **({"fused": True} if fused else {"foreach": True}))


@functools.cache
def adamw_8bit_class() -> type:
    """bitsandbytes' AdamW8bit with a flat state_dict (runs/checkpoint.py stores tensors and
    scalars, one level deep): no nesting of the quantized state, no shared quantization maps
    (they are constants, put back on load)."""
    bnb_logger = logging.getLogger("bitsandbytes")
    level = bnb_logger.level
    bnb_logger.setLevel(logging.ERROR)  # its import warns about 4-bit CPU kernels, unused here
    try:
        from bitsandbytes.optim import AdamW8bit
    finally:
        bnb_logger.setLevel(level)

    class FlatAdamW8bit(AdamW8bit):
        def state_dict(self):
            state = torch.optim.Optimizer.state_dict(self)
            state["state"] = {i: {k: v for k, v in s.items() if k not in QMAPS}
                              for i, s in state["state"].items()}
            return state

        def load_state_dict(self, state_dict, move_to_device=True):
            super().load_state_dict(state_dict, move_to_device)
            for s in self.state.values():
                if torch.is_tensor(s.get("state1")) and s["state1"].dtype == torch.uint8:
                    device = s["state1"].device
                    s["qmap1"] = self.name2qmap["dynamic"].to(device)
                    s["qmap2"] = self.name2qmap["udynamic"].to(device)

    return FlatAdamW8bit


class StepInBackward:
    """Steps each parameter of `optimizer` inside the backward pass, as soon as its gradient is
    complete (a post-accumulate-grad hook), with the optimizer's own step on that parameter
    alone (the same update as a step after the backward pass), then frees the gradient. Every
    backward pass through the parameters is a step. `finish()` after it returns the
    gradients' global norm, accumulated in the hooks. Before stepping a parameter of
    TRIM_BEFORE_STEP_BYTES or more, the heap's free pages go back to the system."""

    def __init__(self, optimizer: torch.optim.Optimizer):
        self.optimizer = optimizer
        self._norms: list[torch.Tensor] = []
        # the group's index: load_state_dict replaces the group dicts, not their order
        self._group = {id(p): i for i, g in enumerate(optimizer.param_groups)
                       for p in g["params"]}
        self._handles = [p.register_post_accumulate_grad_hook(self._step)
                         for g in optimizer.param_groups for p in g["params"]]

    def _step(self, p: torch.Tensor) -> None:
        self._norms.append(torch.linalg.vector_norm(p.grad.detach(), dtype=torch.float32))
        opt = self.optimizer
        groups = opt.param_groups
        group = groups[self._group[id(p)]]
        params = group["params"]
        if p.numel() * p.element_size() >= TRIM_BEFORE_STEP_BYTES:
            memory.trim()
        opt.param_groups, group["params"] = [group], [p]  # the step sees this parameter alone
        try:
            opt.step()
        finally:
            opt.param_groups, group["params"] = groups, params
        p.grad = None

    def finish(self) -> float:
        """The global norm of the gradients stepped since the last call (0.0: none)."""
        norms, self._norms = self._norms, []
        return float(torch.linalg.vector_norm(torch.stack(norms))) if norms else 0.0

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []
