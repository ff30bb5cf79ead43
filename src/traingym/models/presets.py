"""Model presets: the architecture of common open checkpoints and traingym settings for them.

`model.preset = "qwen3-0.6b"` picks one. Its `settings` (rollout.engine, trainer.lr,
trainer.micro_batch_groups) lie below the run preset, the config file and --set, so a value the user
wrote is never replaced. A preset downloads nothing: when model.path holds a config.json (or is
'embedded') its architecture is checked against the preset's, naming each differing field
(`check_path`).
Architecture numbers are from each release's config.json (sources cited beside them; base and
instruct share one); `params` counts as transformers builds the model
(tests/models/test_presets.py).
Settings are suggestions, not tuned by traingym: "torch" below 1B parameters, "vllm" from 1B; lr and
micro_batch_groups shrink with size, as is common for full-parameter GRPO. `memory` is the trainer's
16 B per parameter (fp32 weights, grads, AdamW moments) plus the engine's copy.
Mixtures of experts (Qwen3-MoE, Mixtral) count every expert in `params` (what memory holds)
and the k experts a token runs in `active_params` (what a token's compute scales with; the
router counts whole); every layer is sparse (Qwen3-MoE's `mlp_only_layers` are not modelled).
Not covered: activations, the KV cache and vLLM's cache pool (on top of `memory`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from traingym.models.families import family_of

TRAINER_BYTES_PER_PARAM = 16  # fp32 weights + fp32 grads + AdamW exp_avg + exp_avg_sq
ENGINE_BYTES_PER_PARAM = {"bfloat16": 2, "float32": 4}
EMBEDDED_PRESET = "smollm2-135m"  # model.path='embedded' is SmolLM2-135M-Instruct


@dataclass(frozen=True)
class Arch:
    model_type: str
    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied: bool
    experts: int = 0  # a mixture of experts: experts per layer (0: dense)
    experts_per_token: int = 0  # k, the experts each token runs
    expert_intermediate: int = 0  # each expert's MLP width

    def params(self, active: bool = False) -> int:
        """Parameters as transformers builds the model (tied embeddings counted once);
        `active`: those one token runs (k experts of each MoE layer, not all)."""
        family = family_of(self.model_type).name
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        attn = 2 * self.hidden * q + 2 * self.hidden * kv  # q, o; k, v
        if family == "qwen2":
            attn += q + 2 * kv  # q/k/v biases
        norms = (4 if family in ("gemma2", "gemma3") else 2) * self.hidden
        if family in ("qwen3", "gemma3", "qwen3_moe"):
            norms += 2 * self.head_dim  # q_norm, k_norm
        if self.experts:
            ran = self.experts_per_token if active else self.experts
            mlp = ran * 3 * self.hidden * self.expert_intermediate + self.hidden * self.experts
        else:
            mlp = 3 * self.hidden * self.intermediate
        layer = attn + mlp + norms
        embeddings = self.vocab * self.hidden * (1 if self.tied else 2)
        return embeddings + self.layers * layer + self.hidden  # + the final norm


@dataclass(frozen=True)
class ModelPreset:
    name: str
    hf_ids: tuple[str, ...]
    arch: Arch
    lr: float
    micro_batch_groups: int

    @property
    def params(self) -> int:
        return self.arch.params()

    @property
    def active_params(self) -> int:
        """Parameters one token runs (= params for a dense model)."""
        return self.arch.params(active=True)

    @property
    def engine(self) -> str:
        return "torch" if self.params < 1e9 else "vllm"

    def memory(self, engine_dtype: str = "bfloat16") -> dict[str, int]:
        """Bytes: the trainer's state, the engine's copy of the weights, and their sum (all
        experts: a mixture of experts holds every one)."""
        trainer = TRAINER_BYTES_PER_PARAM * self.params
        engine = ENGINE_BYTES_PER_PARAM[engine_dtype] * self.params
        return {"trainer": trainer, "engine": engine, "total": trainer + engine}

    def settings(self) -> dict:
        """The partial config this preset contributes (under the user's values)."""
        return {"rollout": {"engine": self.engine},
                "trainer": {"lr": self.lr, "micro_batch_groups": self.micro_batch_groups}}


def _p(name, hf_ids, model_type, layers, hidden, intermediate, heads, kv_heads, head_dim,
       vocab, tied, lr, micro_batch_groups, moe=(0, 0, 0)) -> ModelPreset:
    """`moe`: (experts, experts per token, expert width) of a mixture of experts."""
    arch = Arch(model_type, layers, hidden, intermediate, heads, kv_heads, head_dim, vocab, tied,
                *moe)
    return ModelPreset(name, hf_ids, arch, lr, micro_batch_groups)


# Sources (config.json of the release):
# [mlc] mlc-ai/mlc-llm python/mlc_llm/model/model_preset.py @79d603f, which copies the
#       releases' config.json files (its key in parentheses below);
# [hf]  huggingface.co pages holding a copy of the release's config.json (URL given).
_PRESETS = (
    # name, hf ids, model_type, layers, hidden, intermediate, heads, kv, head_dim, vocab, tied,
    # lr, micro_batch_groups
    # Qwen3-0.6B, 1.7B: [mlc] (qwen3_0.6b), (qwen3_1.7b); 0.6B also [hf]
    # huggingface.co/TensorStack/TextEncoder/blob/main/Qwen-3-06B/config.json
    _p("qwen3-0.6b", ("Qwen/Qwen3-0.6B",), "qwen3", 28, 1024, 3072, 16, 8, 128, 151936, True,
       5e-6, 4),
    _p("qwen3-1.7b", ("Qwen/Qwen3-1.7B",), "qwen3", 28, 2048, 6144, 16, 8, 128, 151936, True,
       5e-6, 2),
    # Qwen3-4B: [hf] huggingface.co/MultiRL/qwen3_4b_instruct_sft/blob/main/config.json and
    # huggingface.co/decompute/slm1/blob/main/config.json (copies carrying Qwen3-4B's numbers)
    _p("qwen3-4b", ("Qwen/Qwen3-4B",), "qwen3", 36, 2560, 9728, 32, 8, 128, 151936, True,
       2e-6, 2),
    # Qwen3-8B: [hf] huggingface.co/thejaminator/qwen-hook-layer-9/commit/478fb72 ("Copy
    # config.json from Qwen/Qwen3-8B")
    _p("qwen3-8b", ("Qwen/Qwen3-8B",), "qwen3", 36, 4096, 12288, 32, 8, 128, 151936, False,
       1e-6, 1),
    # Qwen3-14B: [hf] huggingface.co/NousResearch/NousCoder-14B/blob/main/config.json (a
    # Qwen3-14B fine-tune; architecture fields as Qwen3-14B's)
    _p("qwen3-14b", ("Qwen/Qwen3-14B",), "qwen3", 40, 5120, 17408, 40, 8, 128, 151936, False,
       1e-6, 1),
    # Qwen3-32B: [hf] huggingface.co/ronnywebdevs1/d-m-1/blob/main/config.json (a copy)
    _p("qwen3-32b", ("Qwen/Qwen3-32B",), "qwen3", 64, 5120, 25600, 64, 8, 128, 151936, False,
       5e-7, 1),
    # Llama 3.2 1B / 3B, Llama 3.1 8B: [mlc] (llama3_2_1b), (llama3_2_3b), (llama3_1_8b);
    # RoPE "llama3" scaling, which the fused decode covers
    _p("llama3.2-1b", ("meta-llama/Llama-3.2-1B", "meta-llama/Llama-3.2-1B-Instruct"),
       "llama", 16, 2048, 8192, 32, 8, 64, 128256, True, 5e-6, 2),
    _p("llama3.2-3b", ("meta-llama/Llama-3.2-3B", "meta-llama/Llama-3.2-3B-Instruct"),
       "llama", 28, 3072, 8192, 24, 8, 128, 128256, True, 2e-6, 2),
    _p("llama3.1-8b", ("meta-llama/Llama-3.1-8B", "meta-llama/Llama-3.1-8B-Instruct"),
       "llama", 32, 4096, 14336, 32, 8, 128, 128256, False, 1e-6, 1),
    # Qwen2.5-0.5B: [hf] huggingface.co/osllmai-community/Qwen2.5-0.5B/blob/main/config.json
    # (_name_or_path Qwen/Qwen2.5-0.5B); 1.5B: [hf] huggingface.co/onnx-community/
    # Qwen2.5-1.5B-Instruct/blob/94677ac/config.json; 3B: [mlc] (qwen2.5_3b); 7B: [hf]
    # huggingface.co/osllmai-community/Qwen2.5-7B-Instruct/blob/main/config.json
    _p("qwen2.5-0.5b", ("Qwen/Qwen2.5-0.5B", "Qwen/Qwen2.5-0.5B-Instruct"), "qwen2", 24, 896,
       4864, 14, 2, 64, 151936, True, 1e-5, 4),
    _p("qwen2.5-1.5b", ("Qwen/Qwen2.5-1.5B", "Qwen/Qwen2.5-1.5B-Instruct"), "qwen2", 28,
       1536, 8960, 12, 2, 128, 151936, True, 5e-6, 2),
    _p("qwen2.5-3b", ("Qwen/Qwen2.5-3B", "Qwen/Qwen2.5-3B-Instruct"), "qwen2", 36, 2048,
       11008, 16, 2, 128, 151936, True, 2e-6, 2),
    _p("qwen2.5-7b", ("Qwen/Qwen2.5-7B", "Qwen/Qwen2.5-7B-Instruct"), "qwen2", 28, 3584,
       18944, 28, 4, 128, 152064, False, 1e-6, 1),
    # Mistral 7B v0.3 (sliding_window null) and v0.1 (sliding_window 4096, vocab 32000):
    # [mlc] (mistral_7b_v03), (mistral_7b)
    _p("mistral-7b", ("mistralai/Mistral-7B-v0.3", "mistralai/Mistral-7B-Instruct-v0.3"),
       "mistral", 32, 4096, 14336, 32, 8, 128, 32768, False, 1e-6, 1),
    _p("mistral-7b-v0.1", ("mistralai/Mistral-7B-v0.1", "mistralai/Mistral-7B-Instruct-v0.1"),
       "mistral", 32, 4096, 14336, 32, 8, 128, 32000, False, 1e-6, 1),
    # Gemma 2 2B / 9B: [mlc] (gemma2_2b), (gemma2_9b); tie_word_embeddings absent: Gemma2's
    # default, tied
    _p("gemma2-2b", ("google/gemma-2-2b", "google/gemma-2-2b-it"), "gemma2", 26, 2304, 9216,
       8, 4, 256, 256000, True, 2e-6, 2),
    _p("gemma2-9b", ("google/gemma-2-9b", "google/gemma-2-9b-it"), "gemma2", 42, 3584, 14336,
       16, 8, 256, 256000, True, 1e-6, 1),
    # SmolLM2 135M / 360M: [mlc] (smollm2_135m), (smollm2_360m); 135M also the embedded
    # model's own config.json; 1.7B: [mlc] (smollm2_1_7b, a commented-out copy)
    _p("smollm2-135m", ("HuggingFaceTB/SmolLM2-135M", "HuggingFaceTB/SmolLM2-135M-Instruct"),
       "llama", 30, 576, 1536, 9, 3, 64, 49152, True, 1e-5, 4),
    _p("smollm2-360m", ("HuggingFaceTB/SmolLM2-360M", "HuggingFaceTB/SmolLM2-360M-Instruct"),
       "llama", 32, 960, 2560, 15, 5, 64, 49152, True, 1e-5, 4),
    _p("smollm2-1.7b", ("HuggingFaceTB/SmolLM2-1.7B", "HuggingFaceTB/SmolLM2-1.7B-Instruct"),
       "llama", 24, 2048, 8192, 32, 32, 64, 49152, True, 5e-6, 2),
    # Mixtures of experts (moe = experts, per token, expert width). Qwen3-30B-A3B: [code]
    # zyzshishui/slime (a THUDM/slime fork) scripts/models/qwen3-30B-A3B.sh (48 layers, hidden
    # 2048, ffn 6144, moe ffn 768, 32 heads, 4 query groups, kv channels 128, 128 experts, top
    # 8, vocab 151936, untied), as copied config.json fixtures in other public repositories
    # give it; the counts equal Qwen's model card (30.5B total, 3.3B activated).
    _p("qwen3-30b-a3b", ("Qwen/Qwen3-30B-A3B", "Qwen/Qwen3-30B-A3B-Base"), "qwen3_moe", 48,
       2048, 6144, 32, 4, 128, 151936, False, 5e-7, 1, moe=(128, 8, 768)),
    # Mixtral-8x7B v0.1: its config.json's numbers (hidden 4096, intermediate_size 14336 =
    # each expert's width, 32 layers, 32 heads, 8 kv heads, head_dim 4096 / 32, vocab 32000,
    # num_local_experts 8, num_experts_per_tok 2, untied), not re-read from the release here:
    # checked by the counts, which equal Mistral's announcement (46.7B total, 12.9B a token).
    _p("mixtral-8x7b", ("mistralai/Mixtral-8x7B-v0.1", "mistralai/Mixtral-8x7B-Instruct-v0.1"),
       "mixtral", 32, 4096, 14336, 32, 8, 128, 32000, False, 5e-7, 1, moe=(8, 2, 14336)),
)
PRESETS: dict[str, ModelPreset] = {p.name: p for p in _PRESETS}


def get(name: str) -> ModelPreset:
    """A preset by name; the error names the closest one."""
    from traingym.core.errors import ConfigError, did_you_mean  # heavy: pydantic

    if name not in PRESETS:
        raise ConfigError(f"unknown model.preset {name!r}{did_you_mean(name, PRESETS)} "
                          f"(presets: {', '.join(sorted(PRESETS))})")
    return PRESETS[name]


def preset_settings(data: dict) -> dict:
    """The settings of the model preset a raw config (before validation) names, {} if none
    (config/load.py checks that a recommended engine is registered)."""
    model = data.get("model")
    name = model.get("preset") if isinstance(model, dict) else None
    if name is None:
        return {}
    if not isinstance(name, str):
        from traingym.core.errors import ConfigError  # heavy: pydantic

        raise ConfigError(f"model.preset must be a preset name, got {name!r}")
    preset = get(name)
    return preset.settings()


_FIELDS = (  # Arch field, config.json key
    ("model_type", "model_type"), ("layers", "num_hidden_layers"), ("hidden", "hidden_size"),
    ("intermediate", "intermediate_size"), ("heads", "num_attention_heads"),
    ("kv_heads", "num_key_value_heads"), ("head_dim", "head_dim"), ("vocab", "vocab_size"),
    ("tied", "tie_word_embeddings"), ("experts", "num_experts"),
    ("experts_per_token", "num_experts_per_tok"), ("expert_intermediate", "moe_intermediate_size"))


def arch_of(config: dict) -> dict:
    """The preset-comparable fields of a config.json, with transformers' defaults for keys
    it leaves out (head_dim: hidden / heads; tie_word_embeddings: the family's default)."""
    family = family_of(config.get("model_type", ""))
    out = {field: config.get(key) for field, key in _FIELDS}
    out["experts"] = out["experts"] or config.get("num_local_experts") or 0  # Mixtral's name
    if not out["experts"]:  # dense
        out["experts_per_token"] = out["expert_intermediate"] = 0
    elif out["expert_intermediate"] is None:  # Mixtral: the experts have intermediate_size
        out["expert_intermediate"] = out["intermediate"]
    if out["head_dim"] is None and out["hidden"] and out["heads"]:
        out["head_dim"] = out["hidden"] // out["heads"]
    if out["tied"] is None and family is not None:
        out["tied"] = family.tied_default
    if out["kv_heads"] is None:
        out["kv_heads"] = out["heads"]
    return out


def matching(config: dict) -> list[str]:
    """The presets whose architecture equals a config.json's."""
    found = arch_of(config)
    return [p.name for p in _PRESETS if vars(p.arch) == found]


def _read_config(path: str) -> dict | None:
    """model.path's config.json as a dict; None when the folder has none."""
    file = Path(path).expanduser() / "config.json"
    if not file.is_file():
        return None
    try:
        return json.loads(file.read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"model.path={path!r}: cannot read {file}: {e}") from None


def model_type_of(path: str, preset: str | None = None) -> str | None:
    """The model_type model.path (or its preset) holds: 'llama' for 'tiny' and 'embedded', a
    local folder's config.json's; None when not known before loading (a hub id, no folder)."""
    if path in ("tiny", "embedded"):
        return "llama"
    config = _read_config(path)
    if config is not None:
        return config.get("model_type")
    return PRESETS[preset].arch.model_type if preset in PRESETS else None


def check_path(name: str, path: str) -> None:
    """ValueError naming each field where model.path's config.json differs from the preset."""
    preset = get(name)
    if path == "tiny":
        raise ValueError(f"model.preset={name!r} describes {preset.hf_ids[0]}, but "
                         "model.path='tiny' is traingym's 0.1M-parameter test model; set "
                         f"model.path to a local folder holding {preset.hf_ids[0]}")
    if path == "embedded":
        found, where = vars(PRESETS[EMBEDDED_PRESET].arch), "'embedded' (SmolLM2-135M-Instruct)"
        others = [EMBEDDED_PRESET]
    else:
        config = _read_config(path)
        if config is None:
            return  # no folder yet: the run refuses it when it starts (models/loader.py)
        found, where, others = arch_of(config), repr(path), matching(config)
    want = vars(preset.arch)
    diff = [f"{key}={found[field]!r} (the preset: {want[field]!r})"
            for field, key in _FIELDS if found[field] != want[field]]
    if diff:
        hint = f"; that model matches model.preset {others[0]!r}" if others else ""
        raise ValueError(f"model.preset={name!r} ({preset.hf_ids[0]}) does not match "
                         f"model.path={where}: its config.json has {', '.join(diff)}{hint}")
