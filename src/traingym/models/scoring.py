"""Log-probs of given completion tokens from full prompt + completion rows, shared by the
built-in engine's `score` (rollout/torch_engine.py) and the trainer's full-sequence path
(trainer/micro.py `sequence_logprobs`), so both compute the same numbers the same way.

`row_logits` runs one forward over each row's left-padded prompt and right-padded completion
(no KV cache) and keeps the logits of the completion positions only. `token_logprobs` gives
log softmax(logits / T) at the given tokens as gather(z) - logsumexp(z), z = logits / T, in
fp32, without materialising the (B, C, V) log-softmax. Temperature: T <= 0 (greedy) means
softmax(logits), as the engines' sampling log-probs. `contiguous_head_input` wraps every
forward that passes `logits_to_keep`: row_logits, the trainer's prompt pass, the engine's
unfused prefill. `short_rows_attention` picks the attention kernel of the passes here and
in the trainer's shared-prompt path (trainer/logprobs.py).
"""

from __future__ import annotations

import contextlib

import torch

from traingym.core.padding import left_pad, right_pad


MATH_ATTENTION_TOKENS = 128


def short_rows_attention(model, tokens: int):
    """On a CPU, a pass whose rows hold at most MATH_ATTENTION_TOKENS tokens (prompt plus
    completion) runs scaled-dot-product attention on torch's math kernel instead of its CPU
    flash kernel: on the default task's rows the flash kernel's forward plus backward takes
    about 2.5x as long, and from about 192 tokens on the math kernel (which holds the whole
    (T, T) attention matrix, in fp32) loses (benchmarks/attention_kernels.py). The math
    kernel computes bf16 inputs in fp32, and keeps fp32 copies for the backward (more memory
    per pass than the flash kernel). Elsewhere, and under gradient checkpointing (whose
    recompute runs in the backward pass, outside this block, so it would pick another kernel
    than the forward did): torch's own choice."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    inner = getattr(model, "module", model)
    checkpointing = getattr(inner, "is_activation_checkpointing",  # transformers >= 5.2x
                            None)
    if checkpointing is None:
        checkpointing = getattr(inner, "is_gradient_checkpointing", False)
    if (next(inner.parameters()).device.type != "cpu" or tokens > MATH_ATTENTION_TOKENS
            or checkpointing):
        return contextlib.nullcontext()
    return sdpa_kernel([SDPBackend.MATH])


@contextlib.contextmanager
def contiguous_head_input(model):
    """While the block runs, the model's LM head gets its input contiguous. HF slices the last
    hidden states for `logits_to_keep` (a strided view); torch.matmul does not fold such a
    (B, T, H) view into one matrix product but expands the head's (V, H) weight B times and
    copies it: B transposed copies of the head in memory, and about 200x the time (4 rows, a
    50k x 2048 bf16 head: 2.2 s against 0.011 s). `model` may be wrapped (DDP: `.module`)."""
    head = getattr(model, "module", model).get_output_embeddings()
    if head is None:  # no LM head: nothing to do
        yield
        return
    handle = head.register_forward_pre_hook(
        lambda module, args: (args[0].contiguous(), *args[1:]))
    try:
        yield
    finally:
        handle.remove()


def row_logits(model, prompts, completions, pad_token_id: int):
    """(logits_B_C_V, comp_B_C, cmask_B_C): row b is prompts[b] + completions[b];
    logits_B_C_V[b, t] predicts comp_B_C[b, t] (fp32 when the model computes in bf16/fp16)."""
    device = next(model.parameters()).device
    ids_B_L, pmask_B_L = left_pad(prompts, pad_token_id, device)
    comp_B_C, cmask_B_C = right_pad(completions, pad_token_id, device)
    attn_B_S = torch.cat([pmask_B_L, cmask_B_C], dim=1)
    with contiguous_head_input(model), short_rows_attention(model, attn_B_S.shape[1]):
        logits_B_C_V = model(
            input_ids=torch.cat([ids_B_L, comp_B_C], dim=1), attention_mask=attn_B_S,
            position_ids=(attn_B_S.cumsum(-1) - 1).clamp(min=0), use_cache=False,
            logits_to_keep=comp_B_C.shape[1] + 1).logits[:, :-1]
    if logits_B_C_V.dtype in (torch.bfloat16, torch.float16):
        logits_B_C_V = logits_B_C_V.float()
    return logits_B_C_V, comp_B_C, cmask_B_C


def scaled(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """logits / T; T <= 0 (greedy) leaves them as they are."""
    return logits / temperature if temperature > 0 and temperature != 1.0 else logits


def token_logprobs(logits_B_C_V: torch.Tensor, ids_B_C: torch.Tensor,
                   temperature: float) -> torch.Tensor:
    """log softmax(logits / T) at ids, (B, C): gather minus logsumexp, no log-softmax tensor."""
    z_B_C_V = scaled(logits_B_C_V, temperature)
    return z_B_C_V.gather(-1, ids_B_C[..., None])[..., 0] - z_B_C_V.logsumexp(-1)
