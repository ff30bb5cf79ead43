"""Model presets (models/presets.py): parameter counts against transformers, the documented
suggestion rules, the merge under the user's values, and the architecture check of
model.path."""

import json
import re

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from traingym.core.errors import ConfigError
from traingym.config.load import build_config
from traingym.models import presets
from traingym.models.moe import active_params
from traingym.models.presets import PRESETS
from traingym.rollout import registry


def hf_config(preset):
    a = preset.arch
    moe = {}
    if a.model_type == "qwen3_moe":
        moe = dict(num_experts=a.experts, num_experts_per_tok=a.experts_per_token,
                   moe_intermediate_size=a.expert_intermediate)
    elif a.model_type == "mixtral":
        assert a.expert_intermediate == a.intermediate
        moe = dict(num_local_experts=a.experts, num_experts_per_tok=a.experts_per_token)
    return AutoConfig.for_model(
        a.model_type, num_hidden_layers=a.layers, hidden_size=a.hidden,
        intermediate_size=a.intermediate, num_attention_heads=a.heads,
        num_key_value_heads=a.kv_heads, head_dim=a.head_dim, vocab_size=a.vocab,
        tie_word_embeddings=a.tied, **moe)


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_params_equal_what_transformers_builds(name):
    preset = PRESETS[name]
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf_config(preset))
    assert sum(p.numel() for p in model.parameters()) == preset.params
    assert (model.lm_head.weight is model.model.embed_tokens.weight) == preset.arch.tied
    assert active_params(model) == preset.active_params  # models/moe.py, as `traingym plan`


def test_moe_presets_count_active_and_total_as_published():
    """Qwen3-30B-A3B: 30.5B total, 3.3B activated (Qwen's card); Mixtral-8x7B: 46.7B total,
    12.9B a token (Mistral's announcement). Memory holds every expert."""
    for name, total, active in (("qwen3-30b-a3b", 30.5e9, 3.3e9),
                                ("mixtral-8x7b", 46.7e9, 12.9e9)):
        p = PRESETS[name]
        assert abs(p.params / total - 1) < 0.01 and abs(p.active_params / active - 1) < 0.02
        assert p.memory()["total"] == 18 * p.params and p.engine == "vllm"
    assert all(p.active_params == p.params for p in PRESETS.values() if not p.arch.experts)


def test_params_are_near_the_size_in_the_name():
    """A typo in the architecture table (a layer count, a width) moves the count far off."""
    for name, preset in PRESETS.items():
        size = re.search(r"-(?:(\d+)x)?(\d+(?:\.\d+)?)([bm])", name)  # 8x7b: 56B nominal
        nominal = int(size[1] or 1) * float(size[2]) * (1e9 if size[3] == "b" else 1e6)
        assert 0.75 < preset.params / nominal < 1.35, (name, preset.params)


def test_suggestions_follow_the_documented_rules():
    for preset in PRESETS.values():
        n = preset.params
        assert preset.engine == ("torch" if n < 1e9 else "vllm")
        lr = (1e-5 if n < 0.5e9 else 5e-6 if n < 2e9 else 2e-6 if n < 5e9 else 1e-6 if n < 15e9
              else 5e-7)
        assert preset.lr == lr, preset.name
        assert preset.micro_batch_groups == (4 if n < 1e9 else 2 if n < 5e9 else 1), preset.name
        mem = preset.memory()
        assert mem == {"trainer": 16 * n, "engine": 2 * n, "total": 18 * n}
        assert preset.memory("float32")["engine"] == 4 * n


@pytest.fixture
def qwen3_folder(tmp_path):
    """A folder whose config.json is Qwen3-0.6B's, as transformers writes it (no weights:
    the check reads config.json only)."""
    folder = tmp_path / "qwen3-0.6b"
    hf_config(PRESETS["qwen3-0.6b"]).save_pretrained(folder)
    return str(folder)


def test_a_preset_fills_what_the_user_left_unset(qwen3_folder):
    cfg = build_config(overrides={"model": {"preset": "qwen3-0.6b", "path": qwen3_folder}})
    assert cfg.rollout.engine == "torch"
    assert cfg.trainer.lr == 5e-6 and cfg.trainer.micro_batch_groups == 4
    assert cfg.model.preset == "qwen3-0.6b"


def test_a_value_the_user_set_is_never_dropped(qwen3_folder, tmp_path):
    file = tmp_path / "run.toml"
    file.write_text("[trainer]\nlr = 7e-6\n\n[rollout]\ngroup_size = 8\n")
    cfg = build_config(file=file, overrides=[
        "model.preset=qwen3-0.6b", f"model.path={qwen3_folder}",
        "trainer.micro_batch_groups=3"])
    assert cfg.trainer.lr == 7e-6  # the file, inside a section the preset also fills
    assert cfg.trainer.micro_batch_groups == 3  # --set
    assert cfg.rollout.group_size == 8 and cfg.rollout.engine == "torch"  # file; preset
    # the run preset is the user's choice too: 'tiny' sets trainer.lr, the model preset not
    cfg = build_config("tiny", overrides={"model": {"preset": "qwen3-0.6b",
                                                    "path": qwen3_folder}})
    assert cfg.trainer.lr == 1e-3 and cfg.trainer.micro_batch_groups == 4
    assert cfg.model.engine_dtype == "float32"
    # a value equal to the schema default, written by the user, is still the user's
    cfg = build_config(overrides={"model": {"preset": "qwen3-0.6b", "path": qwen3_folder},
                                  "trainer": {"micro_batch_groups": 4, "lr": 1e-5}})
    assert cfg.trainer.lr == 1e-5


def test_an_unknown_preset_names_the_closest():
    with pytest.raises(ConfigError, match=r"unknown model.preset 'qwen3-0.5b'; did you mean "
                                          r"'qwen3-0.6b'\?"):
        build_config(overrides=["model.preset=qwen3-0.5b"])


def test_the_folder_must_hold_the_presets_architecture(tmp_path):
    folder = tmp_path / "qwen25"
    hf_config(PRESETS["qwen2.5-0.5b"]).save_pretrained(folder)
    with pytest.raises(ConfigError) as e:
        build_config(overrides={"model": {"preset": "qwen3-0.6b", "path": str(folder)}})
    msg = str(e.value)
    assert "model_type='qwen2' (the preset: 'qwen3')" in msg
    assert "num_hidden_layers=24 (the preset: 28)" in msg
    assert "matches model.preset 'qwen2.5-0.5b'" in msg
    build_config(overrides={"model": {"preset": "qwen2.5-0.5b", "path": str(folder)}})


def test_tiny_and_embedded_paths(tmp_path):
    with pytest.raises(ConfigError, match="'tiny' is traingym's 0.1M-parameter test model"):
        build_config(overrides={"model": {"preset": "qwen3-0.6b", "path": "tiny"}})
    cfg = build_config(overrides={"model": {"preset": "smollm2-135m"}})  # path 'embedded'
    assert cfg.trainer.lr == 1e-5 and cfg.rollout.engine == "torch"
    with pytest.raises(ConfigError, match="matches model.preset 'smollm2-135m'"):
        build_config(overrides={"model": {"preset": "qwen3-0.6b"}})
    # a folder that does not exist yet is not checked here (the run refuses it at start)
    cfg = build_config(overrides={"model": {"preset": "qwen3-0.6b",
                                            "path": str(tmp_path / "later")}})
    assert cfg.trainer.lr == 5e-6


def test_the_embedded_model_is_the_smollm2_135m_architecture():
    """The converted folder's config.json, converting it here when no earlier test has (about
    15 s), so the result does not depend on which tests ran first."""
    import json

    from prereq import missing

    from traingym.models.embedded import embedded_model_dir, gguf_path

    try:
        gguf_path()
    except FileNotFoundError as e:
        missing(f"the embedded model's GGUF file is absent: {e}")
    folder = embedded_model_dir()
    assert presets.matching(json.loads((folder / "config.json").read_text())) == ["smollm2-135m"]


def test_a_recommended_engine_that_is_not_registered(monkeypatch, tmp_path):
    folder = tmp_path / "qwen3-8b"
    hf_config(PRESETS["qwen3-8b"]).save_pretrained(folder)
    monkeypatch.setattr(registry, "ENGINES", {"torch": registry.ENGINES["torch"]})
    with pytest.raises(ConfigError, match=r"recommends rollout.engine='vllm', which this "
                                          r"install does not register.*rollout.engine='torch'"):
        build_config(overrides={"model": {"preset": "qwen3-8b", "path": str(folder)}})
    cfg = build_config(overrides={"model": {"preset": "qwen3-8b", "path": str(folder)},
                                  "rollout": {"engine": "torch"}})
    assert cfg.rollout.engine == "torch" and cfg.trainer.lr == 1e-6
    assert cfg.trainer.micro_batch_groups == 1


def test_plan_counts_a_preset_without_its_weights(capsys, tmp_path):
    """`traingym plan` sizes a preset's model from the table: no folder needed yet."""
    from traingym import cli

    argv = ["plan", "--set", "model.preset=qwen3-8b", "--set", f"model.path={tmp_path / 'x'}",
            "--set", "rollout.engine=torch", "--gpus", "8", "--gpu", "h100", "--sim-steps", "8"]
    assert cli.main(argv) == 0
    assert f"{PRESETS['qwen3-8b'].params / 1e6:.2f}M params" in capsys.readouterr().out


@pytest.mark.parametrize("name", ["qwen3-30b-a3b", "mixtral-8x7b"])
def test_a_moe_folder_is_checked_against_its_experts(name, tmp_path):
    """config.json as transformers writes it (Mixtral: num_local_experts, no
    moe_intermediate_size); another expert count is named."""
    preset = PRESETS[name]
    folder = tmp_path / name
    hf_config(preset).save_pretrained(folder)
    presets.check_path(name, str(folder))  # matches
    assert presets.matching(json.loads((folder / "config.json").read_text())) == [name]
    cfg = build_config(overrides={"model": {"preset": name, "path": str(folder)}})
    assert cfg.rollout.engine == "vllm" and cfg.trainer.lr == 5e-7
    key = "num_experts" if preset.arch.model_type == "qwen3_moe" else "num_local_experts"
    data = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**data, key: 16}))
    with pytest.raises(ValueError, match=f"num_experts=16 \\(the preset: {preset.arch.experts}"):
        presets.check_path(name, str(folder))
