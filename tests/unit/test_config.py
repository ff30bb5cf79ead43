import pytest

from traingym.config import ConfigError, build_config, parse_overrides


def test_defaults_validate():
    cfg = build_config()
    assert cfg.model.path == "embedded" and cfg.task.name == "arith"


def test_unknown_key_fails_and_names_valid_keys():
    with pytest.raises(ConfigError) as e:
        build_config(overrides=["trainer.lrr=1"])
    assert "unknown key 'trainer.lrr'" in str(e.value)
    assert "trainer.lr" in str(e.value)


def test_bad_value_names_field():
    with pytest.raises(ConfigError, match="rollout.group_size"):
        build_config(overrides=["rollout.group_size=1"])


def test_overrides_parse_json_values():
    assert parse_overrides(["a.b=3", "c=x", "d=true", "e=[1,2]"]) == {
        "a": {"b": 3}, "c": "x", "d": True, "e": [1, 2]}
    with pytest.raises(ConfigError, match="key=value"):
        parse_overrides(["steps"])


def test_preset_never_drops_user_values(tmp_path):
    f = tmp_path / "c.toml"
    f.write_text('steps = 7\n[rollout]\nmax_new_tokens = 3\n')
    cfg = build_config("tiny", f, ["trainer.lr=0.5"])
    assert cfg.steps == 7 and cfg.rollout.max_new_tokens == 3 and cfg.trainer.lr == 0.5
    assert cfg.model.path == "tiny" and cfg.rollout.group_size == 4  # preset values kept


def test_yaml_and_unknown_preset(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("steps: 5\nmodel:\n  path: tiny\n")
    assert build_config(file=f).steps == 5
    with pytest.raises(ConfigError, match="unknown preset"):
        build_config("huge")
