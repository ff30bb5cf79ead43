import pytest

from traingym.core.errors import ConfigError
from traingym.config.load import build_config, parse_overrides


def test_defaults_validate():
    cfg = build_config()
    assert cfg.model.path == "embedded" and cfg.task.name == "arith"


def test_unknown_key_fails_and_suggests_the_closest():
    with pytest.raises(ConfigError) as e:
        build_config(overrides=["trainer.lrr=1"])
    assert str(e.value) == "invalid config: unknown key 'trainer.lrr'; did you mean 'trainer.lr'?"
    with pytest.raises(ConfigError, match="unknown key 'step'; did you mean 'steps'"):
        build_config(overrides=["step=3"])
    with pytest.raises(ConfigError, match="unknown section 'rolout'; did you mean 'rollout'"):
        build_config(overrides={"rolout": {"group_size": 2}})
    with pytest.raises(ConfigError, match="unknown key 'lr'; did you mean 'trainer.lr'"):
        build_config(overrides=["lr=1"])


def test_unknown_key_without_a_close_one_lists_only_its_section():
    with pytest.raises(ConfigError) as e:
        build_config(overrides=["eval.zzz=1"])
    assert str(e.value) == ("invalid config: unknown key 'eval.zzz'; valid keys in 'eval': "
                            "after, before, metric, num_prompts, samples_per_prompt")


def test_task_name_is_a_builtin_task():
    assert build_config(overrides=["task.name=add2"]).task.name == "add2"
    with pytest.raises(ConfigError, match=r"unknown built-in task 'mult'; choose one of "
                                          r"\['add2', 'arith'\]"):
        build_config(overrides=["task.name=mult"])
    with pytest.raises(ConfigError, match="did you mean 'arith'"):
        build_config(overrides=["task.name=arth"])


def test_file_syntax_errors_name_file_and_line(tmp_path):
    for name, text, problem in [("c.toml", "steps = \n", "not valid TOML: .* line 1"),
                                ("c.yaml", "a: [\n", "not valid YAML: .* line 2"),
                                ("c.json", "{\n oops", "not valid JSON: .* line 2"),
                                ("d.json", "[1]", "expected keys .* got a list")]:
        (tmp_path / name).write_text(text)
        with pytest.raises(ConfigError, match=f"{name}: {problem}"):
            build_config(file=tmp_path / name)
    with pytest.raises(ConfigError, match="is a directory"):
        build_config(file=tmp_path)


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
    with pytest.raises(ConfigError, match="did you mean 'tiny'"):
        build_config("tinyy")
