"""Training clients: a base model loaded once, and per client its LoRA adapters (or a full copy
for full fine-tuning) with its own AdamW.

LoRA clients on one base share its weights: each client's model is a copy of the base's module
tree whose parameters and buffers ARE the base's (copy.deepcopy with those tensors in the
memo), so peft injects adapters into that client's own modules and the frozen base is held
once, however many clients train on it. Memory per LoRA client: its adapters, their gradients
and AdamW moments (3 x adapter size) and the activations of its own forward passes. A full
fine-tuning client holds a whole copy of the base (its weights, gradients and 2 moments: 16
bytes per parameter in fp32).

LoRA targets follow the SDK's LoraConfig: train_attn -> q/k/v/o_proj, train_mlp -> gate/up/
down_proj, train_unembed -> lm_head, among the model's linear layers with those names; scale
alpha / rank with alpha from the server's config (`lora_alpha`). Gradients accumulate across
forward_backward calls (and over the passes one request is split into, at most `pass_tokens`
padded tokens each) until optim_step, which applies torch's AdamW (lr, betas, eps and
decoupled weight decay as given per step; `grad_clip_norm` > 0 clips the global norm first)
and zeroes them. Forward passes run in fp32 on the model's device (the CPU here).
"""

from __future__ import annotations

import copy
import random
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import torch

from traingym.core.padding import right_pad
from traingym.models.loader import load_policy
from traingym.models.lora import LoraShape, adapter_state, apply_lora
from traingym.models.scoring import token_logprobs
from traingym.tinker import losses
from traingym.tinker.futures import Lane, UserError
from traingym.trainer.config import TrainerConfig
from traingym.trainer.logprobs import completion_logprobs
from traingym.trainer.optimizers import make_optimizer

ATTN = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP = ("gate_proj", "up_proj", "down_proj")


@dataclass
class Base:
    name: str
    model: torch.nn.Module  # shared, frozen for LoRA clients
    tokenizer: object
    tokenizer_dir: Path  # a folder AutoTokenizer.from_pretrained loads (get_info's tokenizer_id)

    @property
    def arch(self) -> str:
        return type(self.model).__name__

    @property
    def max_context(self) -> int:
        return int(getattr(self.model.config, "max_position_embeddings", 0) or 0)


def load_base(name: str, tokenizer_root: Path, seed: int = 0) -> Base:
    model, tok = load_policy(name, seed=seed)
    model.eval()  # no dropout: forward passes are deterministic
    for p in model.parameters():
        p.requires_grad_(False)
    folder = tokenizer_root / _safe(name)
    if not (folder / "tokenizer_config.json").is_file():
        folder.mkdir(parents=True, exist_ok=True)
        tok.save_pretrained(folder)
    return Base(name, model, tok, folder.resolve())


def _safe(text: str) -> str:
    return "".join(c if c.isalnum() or c in "._-" else "_" for c in text).strip("._") or "model"


def lora_targets(model, train_attn: bool, train_mlp: bool, train_unembed: bool) -> tuple:
    linear = {n.rsplit(".", 1)[-1] for n, m in model.named_modules()
              if isinstance(m, torch.nn.Linear)}
    want = (ATTN if train_attn else ()) + (MLP if train_mlp else ()) + \
        (("lm_head",) if train_unembed else ())
    targets = tuple(t for t in want if t in linear)
    if not targets:
        raise UserError(f"the LoRA config selects no linear layer of this model (its linear "
                        f"layers: {sorted(linear)})")
    return targets


def shared_prompts(data, loss_fn: str) -> tuple[list, list[int]]:
    """Split datums into groups sharing a prompt and the rest (full rows). Datum i with input
    x and targets y is prompt x[:k + 1] and completion y[k:] when its loss weights are 0
    before position k and not at k, and from k on its targets are its input shifted by one
    (x[k + 1:] == y[k:-1]); its targets before k (the cookbook sends 0s there) are only
    scored. Groups in order of first appearance:
    [(prompt, [(i, completion, y[:k]), ...]), ...]."""
    groups: dict[tuple, list] = {}
    rows = []
    for i, (tokens, inputs) in enumerate(data):
        tokens = [int(t) for t in tokens]
        targets = [int(t) for t in np.asarray(inputs["target_tokens"]).tolist()]
        active = np.flatnonzero(losses.weights(loss_fn, inputs))
        k = int(active[0]) if active.size else -1
        if k < 0 or tokens[k + 1:] != targets[k:-1]:
            rows.append(i)
            continue
        groups.setdefault(tuple(tokens[:k + 1]), []).append((i, targets[k:], targets[:k]))
    return list(groups.items()), rows


def passes(lengths: list[int], budget: int) -> list[list[int]]:
    """Datum indices per forward pass, in order: as many datums as fit `budget` padded tokens
    (rows x the longest row); a longer datum runs alone. The (rows, length, vocab) fp32 logits
    of one pass are the peak memory of a forward_backward."""
    out: list[list[int]] = [[]]
    longest = 0
    for i, n in enumerate(lengths):
        if out[-1] and (len(out[-1]) + 1) * max(longest, n) > budget:
            out.append([])
            longest = 0
        out[-1].append(i)
        longest = max(longest, n)
    return out


@dataclass
class TrainingModel:
    model_id: str
    base: Base
    lora: dict | None  # {"rank", "seed", "train_attn", "train_mlp", "train_unembed"}; None: full
    alpha: float
    model: torch.nn.Module = field(init=False)
    optimizer: torch.optim.Optimizer = field(init=False)
    lane: Lane = field(default_factory=Lane)
    steps: int = 0
    user_metadata: dict | None = None
    pass_tokens: int = 8192  # padded tokens one forward takes (the config's pass_tokens)
    inflight: object = None  # sampling.Weights its inflight samplers share, once saved so
    last_request: str = field(
        default_factory=lambda: datetime.now(UTC).isoformat())

    def __post_init__(self):
        base = self.base.model
        if self.lora is None:  # full fine-tuning: a copy of its own
            self.model = copy.deepcopy(base)
            for p in self.model.parameters():
                p.requires_grad_(True)
        else:
            shared = {id(t): t for t in [*base.parameters(), *base.buffers()]}
            model = copy.deepcopy(base, memo=shared)  # new modules, the base's tensors
            shape = LoraShape(rank=self.lora["rank"], alpha=self.alpha,
                              target_modules=lora_targets(model, self.lora["train_attn"],
                                                          self.lora["train_mlp"],
                                                          self.lora["train_unembed"]))
            seed = self.lora.get("seed")
            with torch.random.fork_rng():
                torch.manual_seed(seed if seed is not None else random.getrandbits(63))
                self.model = apply_lora(model, shape)
        self.model.eval()
        self.optimizer = make_optimizer(self.model, TrainerConfig())

    @property
    def is_lora(self) -> bool:
        return self.lora is not None

    def meta(self) -> dict:
        return {"base_model": self.base.name, "lora": self.lora, "lora_alpha": self.alpha,
                "steps": self.steps}

    def trainable(self) -> dict[str, torch.Tensor]:
        """What a checkpoint holds: the adapters (LoRA) or every tensor (full)."""
        if self.is_lora:
            return {k: v.contiguous() for k, v in adapter_state(self.model).items()}
        out, seen = {}, set()
        for k, v in self.model.state_dict().items():  # a tied tensor once, under its first name
            if v.data_ptr() not in seen:
                seen.add(v.data_ptr())
                out[k] = v.detach()
        return out

    def load_trainable(self, tensors: dict[str, torch.Tensor]) -> None:
        own = self.trainable()
        if set(tensors) != set(own):
            raise UserError(f"the checkpoint's tensors do not match this model's "
                            f"({len(set(tensors) ^ set(own))} names differ)")
        with torch.no_grad():
            for k, v in own.items():
                if tensors[k].shape != v.shape:
                    raise UserError(f"checkpoint tensor {k}: shape {list(tensors[k].shape)}, "
                                    f"the model's {list(v.shape)}")
                v.copy_(tensors[k])  # adapter_state / state_dict tensors share storage

    def sampler_tensors(self) -> tuple[dict[str, torch.Tensor], float | None]:
        """What a sampler of the current weights keeps: a copy of the adapters and their scale
        alpha / r (LoRA: merged into the base only while the engine serves them), or a copy of
        every tensor and None (full)."""
        if self.is_lora:
            return ({k: v.clone() for k, v in adapter_state(self.model).items()},
                    self.alpha / self.lora["rank"])
        return {k: v.detach().clone() for k, v in self.model.state_dict().items()}, None

    # -- the calls -----------------------------------------------------------------------

    def forward_backward(self, req: dict) -> tuple[list[dict[str, np.ndarray]], dict]:
        """One forward (and backward unless forward_only) over the request's datums: per
        datum its target logprobs and per-token loss; metrics {'loss:sum': the summed loss}.

        A datum whose loss weights (cross_entropy's `weights`, the RL losses' `advantages`)
        are 0 up to position k, and whose targets are its input shifted by one, is a prompt
        (its first k + 1 tokens) and a completion: datums with the same prompt run it once,
        with a KV cache, and only completion positions go through the LM head with a graph
        (trainer/logprobs.py completion_logprobs, as `traingym train` scores a group). The
        prompt positions' log-probs (reported, never trained: their loss and gradient are 0)
        come from one no-grad pass over the distinct prompts. Other datums run as full rows.
        Gradients equal the full-row forward's to float rounding (tests/tinker)."""
        data, loss_fn, config = req["data"], req["loss_fn"], req["config"]
        vocab = self.model.get_input_embeddings().num_embeddings
        for i, (tokens, inputs) in enumerate(data):
            for name, arr in [("model_input", np.asarray(tokens))] + (
                    [("target_tokens", inputs["target_tokens"])] if "target_tokens" in inputs
                    else []):
                if arr.size and (arr.min() < 0 or arr.max() >= vocab):
                    raise UserError(f"datum {i}: {name} has token ids outside [0, {vocab})")
        grad = not req["forward_only"]
        groups, rows = shared_prompts(data, loss_fn)
        outputs: dict[int, dict[str, np.ndarray]] = {}
        total = 0.0
        for kind, part in self._passes(groups, rows, data):
            with torch.set_grad_enabled(grad):
                logps = (self._grouped_logprobs(part) if kind == "groups"
                         else self._row_logprobs([data[i] for i in part]))
            order = [m[0] for _, members in part for m in members] if kind == "groups" else part
            loss = None
            for i, logp_T in zip(order, logps):
                inputs = data[i][1]
                tensors = {k: torch.as_tensor(np.array(v, dtype=np.float32))
                           for k, v in inputs.items() if k != "target_tokens"}
                per_token = losses.elementwise(loss_fn, logp_T, tensors, config)
                loss = per_token.sum() if loss is None else loss + per_token.sum()
                outputs[i] = {"logprobs": logp_T.detach().numpy().astype(np.float32),
                              "elementwise_loss": per_token.detach().numpy().astype(np.float32)}
            if grad and loss.requires_grad:
                loss.backward()  # gradients add up over passes, as over requests
            total += float(loss.detach())
        return [outputs[i] for i in range(len(data))], {"loss:sum": total}

    def _passes(self, groups, rows, data):
        """("groups", [(prompt, [(datum, completion), ...]), ...]) and ("rows", [datum, ...])
        passes of at most `pass_tokens` padded tokens each (a longer one runs alone)."""
        part, size = [], 0
        for prompt, members in groups:
            cost = len(members) * max(len(m[1]) for m in members) + len(prompt)
            if part and size + cost > self.pass_tokens:
                yield "groups", part
                part, size = [], 0
            part.append((prompt, members))
            size += cost
        if part:
            yield "groups", part
        for chunk in passes([len(data[i][0]) for i in rows], self.pass_tokens):
            if chunk:
                yield "rows", [rows[j] for j in chunk]

    def _grouped_logprobs(self, part) -> list[torch.Tensor]:
        """Per member (prompt-major) its (N,) target log-probs: before k from a no-grad pass
        over the distinct prompts, from k on from completion_logprobs."""
        pad = self.base.tokenizer.pad_token_id or 0
        prompts = [prompt for prompt, _ in part]
        completions = [[c for _, c, _ in members] for _, members in part]
        scored = completion_logprobs(self.model, prompts, completions, 1.0, pad)
        inner = [list(p[:-1]) for p in prompts]
        with torch.no_grad():
            if any(inner):
                ids_P_L, mask_P_L = right_pad([r or [pad] for r in inner], pad)
                logits_P_L_V = self.model(input_ids=ids_P_L, attention_mask=mask_P_L,
                                          use_cache=False).logits.float()
        out, row = [], 0
        for p, (_, members) in enumerate(part):
            for _, completion, before in members:
                head = torch.zeros(0)
                if before:
                    head = token_logprobs(logits_P_L_V[p:p + 1, :len(before)],
                                          torch.tensor([before]), 1.0)[0]
                out.append(torch.cat([head, scored.logp_B_T[row, :len(completion)]]))
                row += 1
        return out

    def _row_logprobs(self, data) -> list[torch.Tensor]:
        """Per datum the (N,) log-probs of its target_tokens from a full-row forward, fp32 (a
        datum of no tokens: an empty tensor)."""
        pad = self.base.tokenizer.pad_token_id or 0
        rows = [list(tokens) for tokens, _ in data]
        keep = [i for i, r in enumerate(rows) if r]
        out = [torch.zeros(0) for _ in rows]
        if not keep:
            return out
        targets = [np.asarray(data[i][1]["target_tokens"]).tolist() for i in keep]
        ids_B_T, mask_B_T = right_pad([rows[i] for i in keep], pad)
        tgt_B_T, _ = right_pad(targets, pad)
        logits = self.model(input_ids=ids_B_T, attention_mask=mask_B_T,
                            use_cache=False).logits.float()
        logp_B_T = token_logprobs(logits, tgt_B_T, 1.0)
        for b, i in enumerate(keep):
            out[i] = logp_B_T[b, :len(rows[i])]
        return out

    def optim_step(self, params: dict) -> dict:
        lr = float(params.get("learning_rate", 1e-4))
        for group in self.optimizer.param_groups:
            group["lr"] = lr
            group["betas"] = (float(params.get("beta1", 0.9)), float(params.get("beta2", 0.95)))
            group["eps"] = float(params.get("eps", 1e-12))
            group["weight_decay"] = float(params.get("weight_decay", 0.0))
        trainable = [p for p in self.model.parameters() if p.requires_grad]
        norm = torch.nn.utils.clip_grad_norm_(
            trainable, float(params["grad_clip_norm"])
            if params.get("grad_clip_norm", 0.0) > 0 else float("inf"))
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.steps += 1
        return {"grad_norm:mean": float(norm), "learning_rate:mean": lr}
