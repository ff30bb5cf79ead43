"""The decoder families traingym knows, as transformers ships them, and their chat formats.

A family is what differs between Llama-shaped decoders, read by the fused decode
(rollout/fused_decoder.py) and the presets: mistral slides a window over every layer; qwen2 adds
q/k/v biases; qwen3 per-head q/k RMSNorm and a free head_dim; gemma a GeGLU MLP, scaled
embeddings and RMSNorm x (1 + w); qwen3_moe, mixtral and qwen2_moe are qwen3, mistral and qwen2
with sparse MoE blocks (rollout/fused_moe.py; `router` names the block's router class,
models/moe.py; qwen2_moe adds a sigmoid-gated shared expert); gemma2 sandwich norms, logit
soft-capping and alternating sliding layers; gemma3 is gemma2 without attention soft-capping,
with q/k norms and RoPE per layer type. `CHAT_TEMPLATES` follow each family's published
text-only format and render assistant content verbatim (multi-turn continuation needs it).
System text: its own turn (chatml, llama3), before the first user message (mistral, gemma3),
refused by gemma (Gemma 1/2).
`stop_token_ids` adds the template's one-token end-of-turn marker to eos: Gemma and Llama 3
end turns with a marker that is not their eos.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class Family:
    name: str
    model_types: tuple[str, ...]
    norm: Literal["llama", "gemma"]  # llama: w * x^.to(dtype); gemma: (x^ * (1 + w)).to(dtype)
    activation_attr: str  # the config field naming the MLP activation
    sliding: Literal["none", "all", "layer_types"]  # where config.sliding_window applies
    tied_default: bool  # tie_word_embeddings when config.json does not say
    chat_template: str  # a key of CHAT_TEMPLATES
    attn_softcap: bool = False  # applies config.attn_logit_softcapping (Gemma 3's module
    # stores it but never passes it to attention, so Gemma 3 does not)
    router: str | None = None  # mixture of experts: the class name of its router module


FAMILIES: dict[str, Family] = {f.name: f for f in (
    Family("llama", ("llama",), "llama", "hidden_act", "none", False, "llama3"),
    Family("mistral", ("mistral",), "llama", "hidden_act", "all", False, "mistral"),
    Family("qwen2", ("qwen2",), "llama", "hidden_act", "layer_types", False, "chatml-qwen2.5"),
    Family("qwen3", ("qwen3",), "llama", "hidden_act", "layer_types", False, "qwen3"),
    Family("qwen3_moe", ("qwen3_moe",), "llama", "hidden_act", "all", False, "qwen3",
           router="Qwen3MoeTopKRouter"),
    Family("mixtral", ("mixtral",), "llama", "hidden_act", "all", False, "mistral",
           router="MixtralTopKRouter"),
    Family("qwen2_moe", ("qwen2_moe",), "llama", "hidden_act", "layer_types", False,
           "chatml-qwen2.5", router="Qwen2MoeTopKRouter"),
    Family("gemma", ("gemma",), "gemma", "hidden_act", "none", True, "gemma"),
    Family("gemma2", ("gemma2",), "gemma", "hidden_activation", "layer_types", True, "gemma",
           attn_softcap=True),
    Family("gemma3", ("gemma3_text",), "gemma", "hidden_activation", "layer_types", True,
           "gemma3"),
)}

_BY_MODEL_TYPE = {t: f for f in FAMILIES.values() for t in f.model_types}


def family_of(model_type: str) -> Family | None:
    """The family of a config's `model_type`, or None when traingym does not cover it."""
    return _BY_MODEL_TYPE.get(model_type)


def covered_model_types() -> list[str]:
    return sorted(_BY_MODEL_TYPE)


def moe_routers() -> dict[str, str]:
    """{model_type: its router's class name} of the mixture-of-experts families."""
    return {t: f.router for f in FAMILIES.values() if f.router for t in f.model_types}


def layer_windows(config, family: Family) -> list[int | None]:
    """Each layer's sliding window (keys within `window` slots of the query), None for full
    attention; as each family's HF attention module reads it."""
    n = config.num_hidden_layers
    window = getattr(config, "sliding_window", None)
    if family.sliding == "all":
        return [window] * n
    if family.sliding == "layer_types":
        types = getattr(config, "layer_types", None) or ["full_attention"] * n
        return [window if t == "sliding_attention" else None for t in types[:n]]
    return [None] * n


_CHATML_TURNS = (
    "{%- for message in loop_messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

CHAT_TEMPLATES: dict[str, str] = {
    # Qwen2.5 instruct: ChatML with a default system turn.
    "chatml-qwen2.5": (
        "{%- if messages[0]['role'] == 'system' %}"
        "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
        "{%- set loop_messages = messages[1:] %}"
        "{%- else %}"
        "{{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
        "assistant.<|im_end|>\\n' }}"
        "{%- set loop_messages = messages %}"
        "{%- endif %}" + _CHATML_TURNS),
    # Qwen3: ChatML, no default system turn; enable_thinking=False pre-fills an empty think.
    "qwen3": (
        "{%- set loop_messages = messages %}"
        "{%- for message in loop_messages %}"
        "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
        "{%- endfor %}"
        "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
        "{%- if enable_thinking is defined and enable_thinking is false %}"
        "{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}{%- endif %}"),
    # Llama 3 instruct: header blocks, <|eot_id|> after each turn, bos first.
    "llama3": (
        "{{- bos_token }}"
        "{%- for message in messages %}"
        "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + "
        "message['content'] | trim + '<|eot_id|>' }}"
        "{%- endfor %}"
        "{%- if add_generation_prompt %}"
        "{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"),
    # Mistral instruct: [INST] ... [/INST], the assistant's turn ends with eos.
    "mistral": (
        "{%- if messages[0]['role'] == 'system' %}"
        "{%- set system = messages[0]['content'] + '\\n\\n' %}"
        "{%- set loop_messages = messages[1:] %}"
        "{%- else %}{%- set system = '' %}{%- set loop_messages = messages %}{%- endif %}"
        "{{- bos_token }}"
        "{%- for message in loop_messages %}"
        "{%- if message['role'] == 'user' %}"
        "{{- '[INST] ' + (system if loop.first else '') + message['content'] + ' [/INST]' }}"
        "{%- elif message['role'] == 'assistant' %}{{- message['content'] + eos_token }}"
        "{%- else %}{{- raise_exception('Mistral [INST] format: only user and assistant "
        "messages after an optional first system message') }}{%- endif %}"
        "{%- endfor %}"),
    # Gemma / Gemma 2 instruct: <start_of_turn>user|model, no system role.
    "gemma": (
        "{{- bos_token }}"
        "{%- for message in messages %}"
        "{%- if message['role'] == 'system' %}"
        "{{- raise_exception('System role not supported') }}{%- endif %}"
        "{%- set role = 'model' if message['role'] == 'assistant' else message['role'] %}"
        "{{- '<start_of_turn>' + role + '\\n' + message['content'] | trim + "
        "'<end_of_turn>\\n' }}"
        "{%- endfor %}"
        "{%- if add_generation_prompt %}{{- '<start_of_turn>model\\n' }}{%- endif %}"),
    # Gemma 3 instruct: as Gemma, the system text opens the first user turn.
    "gemma3": (
        "{{- bos_token }}"
        "{%- if messages[0]['role'] == 'system' %}"
        "{%- set prefix = messages[0]['content'] + '\\n\\n' %}"
        "{%- set loop_messages = messages[1:] %}"
        "{%- else %}{%- set prefix = '' %}{%- set loop_messages = messages %}{%- endif %}"
        "{%- for message in loop_messages %}"
        "{%- set role = 'model' if message['role'] == 'assistant' else message['role'] %}"
        "{{- '<start_of_turn>' + role + '\\n' + (prefix if loop.first else '') + "
        "message['content'] | trim + '<end_of_turn>\\n' }}"
        "{%- endfor %}"
        "{%- if add_generation_prompt %}{{- '<start_of_turn>model\\n' }}{%- endif %}"),
}

END_OF_TURN: dict[str, str | None] = {
    "chatml-qwen2.5": "<|im_end|>", "qwen3": "<|im_end|>", "llama3": "<|eot_id|>",
    "mistral": None,  # the tokenizer's eos_token
    "gemma": "<end_of_turn>", "gemma3": "<end_of_turn>",
}


def chat_template(name: str) -> str:
    """A template by name; the error names the closest."""
    if name not in CHAT_TEMPLATES:
        from traingym.core.errors import did_you_mean  # heavy: pydantic

        raise KeyError(f"unknown chat template {name!r}; choose one of {sorted(CHAT_TEMPLATES)}"
                       f"{did_you_mean(name, CHAT_TEMPLATES)}")
    return CHAT_TEMPLATES[name]


def stop_token_ids(tok) -> tuple[int, ...]:
    """The ids that end an assistant turn: the eos token, then every END_OF_TURN marker the
    tokenizer's chat template writes that is one token of its vocabulary."""
    ids = [tok.eos_token_id] if tok.eos_token_id is not None else []
    template = tok.chat_template if isinstance(tok.chat_template, str) else ""
    for marker in sorted({m for m in END_OF_TURN.values() if m}):
        if marker not in template:
            continue
        found = tok.encode(marker, add_special_tokens=False)
        if len(found) == 1 and found[0] not in ids:
            ids.append(found[0])
    return tuple(ids)
