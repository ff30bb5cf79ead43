"""Routes of mixture-of-experts models: which experts each token went to, recorded during a
Hugging Face forward, or forced during one (rollout routing replay).

A route is, per token position and MoE layer, the k expert ids its router chose: an array
(positions, moe layers, k), uint8 where the model has at most 256 experts, else int16 (8
bytes a token per layer at k = 8: a 48-layer model costs 384 bytes a token, not a float per
expert). `routing(model, forced)` hooks every router of the covered families (the router
module transformers 5 gives each sparse MoE block; dense layers, such as Qwen3-MoE's
`mlp_only_layers`, have none and do not count) and, for each forward call while it is open,
keeps the ids each router chose. With `forced` it also replaces them: the experts are the
given ones and their gate weights are the model's own formula over its own router logits at
those experts (softmax over all experts, gathered, renormalised over the k where the family
renormalises: Mixtral always, Qwen3-MoE with `norm_topk_prob`), so the router still gets
gradients and a forced route equal to the router's choice changes nothing. This is the R3
variant (Ma et al. 2025, "Stabilizing MoE RL by aligning training and inference routers"):
replay the inference engine's expert choice, not its gate weights.
Covered: Qwen3-MoE, Mixtral and Qwen2-MoE as transformers >= 5 ships them (routers return
(logits, top-k weights, top-k ids)); Qwen2-MoE's shared expert runs on every token beside the
routed ones and has no route to record or force. Not covered: grouped or biased routers
(DeepSeek-V3), gradient-checkpointed forwards (the recomputation runs after the block closes).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import numpy as np
import torch

from traingym.models.families import moe_routers

ROUTERS: dict[str, str] = moe_routers()  # config.model_type -> its router's class name


def routers(model) -> list[torch.nn.Module]:
    """The model's routers in layer order; [] for a dense or uncovered model. `model` may be
    wrapped (DDP: `.module`)."""
    inner = getattr(model, "module", model)
    name = ROUTERS.get(getattr(getattr(inner, "config", None), "model_type", None))
    if name is None:
        return []
    return [m for m in inner.modules() if type(m).__name__ == name]


def route_dtype(num_experts: int) -> torch.dtype:
    """The smallest integer type holding every expert id: routes are kept in it from the
    forward on (a long per id would be 8 times the memory over a long decode)."""
    return torch.uint8 if num_experts <= 256 else torch.int16


@dataclass
class RouteLog:
    """What `routing` saw: per forward call, (N, L, k) expert ids (N = rows x positions of that
    call, flattened as the model flattens them; L = MoE layers), on the model's device, in
    `route_dtype`."""

    chosen: list[torch.Tensor] = field(default_factory=list)  # each router's own top-k
    used: list[torch.Tensor] = field(default_factory=list)  # what the forward used (= chosen
    # where nothing was forced)
    _layers: list[list[torch.Tensor]] = field(default_factory=list)
    _used: list[list[torch.Tensor]] = field(default_factory=list)

    def _close(self, layers: int) -> None:
        """Stack each call's layers; a call cut short (a forward that raised) is left out."""
        self.chosen = [torch.stack(c, 1) for c in self._layers if len(c) == layers]
        self.used = [torch.stack(u, 1) for u in self._used if len(u) == layers]


def _gate(router, logits_N_E: torch.Tensor, ids_N_K: torch.Tensor, like: torch.Tensor):
    """The router's gate weights at the experts `ids_N_K`, by its own formula."""
    w_N_K = logits_N_E.float().softmax(-1).gather(-1, ids_N_K)
    if getattr(router, "norm_topk_prob", True):  # Mixtral always renormalises
        w_N_K = w_N_K / w_N_K.sum(-1, keepdim=True)
    return w_N_K.to(like.dtype)


@contextlib.contextmanager
def routing(model, forced: list[tuple[torch.Tensor, torch.Tensor]] | None = None):
    """Yields a RouteLog of every forward call the block runs (empty for a dense model).
    `forced`: per forward call, in order, (ids (N, L, k), valid (N,) bool): where valid, the
    tokens go to those experts (module docstring); elsewhere (padding) the router chooses.
    A forced call whose N differs from the forward's, or more forwards than `forced` has,
    raise ValueError."""
    found = routers(model)
    log = RouteLog()
    n_layers = len(found)
    dtype = route_dtype(found[0].num_experts) if found else torch.uint8

    def hook(layer: int):
        def fn(router, args, out):
            logits_N_E, weights_N_K, ids_N_K = out
            if layer == 0:
                log._layers.append([])
                log._used.append([])
            call = len(log._layers) - 1
            if layer != len(log._layers[call]):
                raise RuntimeError(f"routing: router {layer} ran out of layer order")
            log._layers[call].append(ids_N_K.detach().to(dtype))
            if forced is None:
                log._used[call].append(log._layers[call][-1])
                return None
            if call >= len(forced):
                raise ValueError(f"routing: forward call {call + 1} but routes were given for "
                                 f"{len(forced)} calls")
            ids_N_L_K, valid_N = forced[call]
            if ids_N_L_K.shape[0] != ids_N_K.shape[0] or ids_N_L_K.shape[1] != n_layers:
                raise ValueError(f"routing: forward call {call} routes {ids_N_K.shape[0]} "
                                 f"tokens through {n_layers} MoE layers; the forced routes "
                                 f"are {tuple(ids_N_L_K.shape)}")
            use_N_K = torch.where(valid_N[:, None], ids_N_L_K[:, layer].to(ids_N_K), ids_N_K)
            log._used[call].append(use_N_K.detach().to(dtype))
            return logits_N_E, _gate(router, logits_N_E, use_N_K, weights_N_K), use_N_K
        return fn

    handles = [r.register_forward_hook(hook(i)) for i, r in enumerate(found)]
    try:
        yield log
    finally:
        for h in handles:
            h.remove()
        log._close(n_layers)


def differing(a_N_L_K: torch.Tensor, b_N_L_K: torch.Tensor, valid_N: torch.Tensor) -> tuple:
    """(pairs whose expert sets differ, pairs compared): (token, layer) pairs at valid
    tokens; order within the k does not count."""
    a = a_N_L_K.long().sort(-1).values
    b = b_N_L_K.long().to(a.device).sort(-1).values
    diff_N_L = (a != b).any(-1) & valid_N.to(a.device)[:, None]
    return int(diff_N_L.sum()), int(valid_N.sum()) * a.shape[1]


def engine_routes(calls: list[torch.Tensor], prompt_lens: list[int], ns: list[int],
                  lengths: list[int]) -> list[np.ndarray]:
    """Per completion row (prompt-major, `ns[p]` rows of prompt p, `lengths[b]` tokens), its
    routes as the built-in engine's decode ran them, from each forward call's (N, L, k) ids
    (RouteLog.chosen, or the fused decoder's): call 0 the left-padded prefill of every prompt
    (P, T), call j >= 1 the decode forward of completion token j - 1 (B rows); in the calls'
    dtype (route_dtype).
    Row b gets its prompt's positions, then its tokens but the last (never forwarded):
    (len(prompt) + lengths[b] - 1, L, k)."""
    P = len(prompt_lens)
    prefill = calls[0].reshape(P, -1, *calls[0].shape[1:]).cpu()
    T = prefill.shape[1]
    steps = (torch.stack(calls[1:], 1).cpu() if len(calls) > 1
             else torch.zeros(sum(ns), 0, *prefill.shape[2:], dtype=prefill.dtype))
    out, b = [], 0
    for p, (n, plen) in enumerate(zip(ns, prompt_lens)):
        for _ in range(n):
            rows = torch.cat([prefill[p, T - plen:], steps[b, : max(lengths[b] - 1, 0)]])
            out.append(rows.numpy())
            b += 1
    return out


def active_params(model) -> int:
    """Parameters one token runs: all but the experts it is not routed to (k of E in each MoE
    layer, the covered families' `experts` tensors; Qwen2-MoE's shared expert runs on every
    token); all of a dense model's. Works on a meta-device model (counts only)."""
    total = sum(p.numel() for p in model.parameters())
    config = getattr(model, "config", None)
    experts = getattr(config, "num_experts", None) or getattr(config, "num_local_experts", None)
    if not experts or getattr(config, "model_type", None) not in ROUTERS:
        return total
    k = config.num_experts_per_tok
    pooled = sum(p.numel() for n, p in model.named_parameters() if ".experts." in n)
    return total - pooled * (experts - k) // experts
