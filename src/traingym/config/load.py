"""Building a run's config: a preset, then a TOML/YAML/JSON file, then `--set a.b=c` overrides,
validated against the schema (config/schema.py) before any work starts.

Unknown keys fail at load time and name the closest valid one ("did you mean 'steps'?").
Presets are partial configs merged under the user's values: a preset never drops a value the
user set. A model preset (`model.preset`, models/presets.py) goes under everything, the run
preset included: model preset < run preset < file < --set.
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from traingym.algorithms import registry as algorithms
from traingym.algorithms.config import AlgorithmConfig
from traingym.config.schema import PRESETS, Config
from traingym.core.errors import ConfigError, closest, did_you_mean
from traingym.models import presets
from traingym.models.presets import preset_settings
from traingym.rollout import registry as engines

# Keys that moved: an old name's error names the new place (_unknown_key).
MOVED_KEYS: dict[str, str] = {
    **{f"{old}.{k}": f"algorithm.{k}" for old in ("async", "trainer")
       for k in ("is_correction", "is_level", "is_cap")},
    **{f"trainer.{k}": f"algorithm.{k}" for k in ("clip_low", "clip_high", "kl_coef",
                                                   "normalize_std")},
}


def _merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def _valid_keys(model: type[BaseModel], prefix: str = "") -> list[str]:
    keys = []
    for name, field in model.model_fields.items():
        ann, name = field.annotation, field.alias or name
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            keys += _valid_keys(ann, f"{prefix}{name}.")
        else:
            keys.append(prefix + name)
    return keys


def _parse_value(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def parse_overrides(pairs: list[str]) -> dict:
    """['a.b=1', 'c=x'] -> {'a': {'b': 1}, 'c': 'x'} (values parsed as JSON when they are)."""
    out: dict = {}
    for pair in pairs:
        if "=" not in pair:
            raise ConfigError(f"--set {pair!r}: expected key=value, e.g. --set trainer.lr=1e-5")
        key, value = pair.split("=", 1)
        parts = [part.strip() for part in key.split(".")]
        if not all(parts):
            raise ConfigError(f"--set {pair!r}: {key.strip()!r} is not a key; expected dotted "
                              "names, e.g. --set trainer.lr=1e-5")
        node = out
        for i, part in enumerate(parts[:-1]):
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"--set {pair!r}: an earlier --set gave "
                                  f"'{'.'.join(parts[:i + 1])}' the value {node!r}, so it "
                                  "has no keys below it")
        node[parts[-1]] = _parse_value(value)
    return out


def _parse_file(path: Path, text: str) -> Any:
    """The file's contents parsed by its suffix; a syntax error names the file and line."""
    if path.suffix == ".toml":
        try:
            return tomllib.loads(text)
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"config file {path}: not valid TOML: {e}") from None
    if path.suffix in (".yaml", ".yml"):
        import yaml

        try:
            return yaml.safe_load(text) or {}
        except yaml.YAMLError as e:
            where = getattr(e, "problem_mark", None)
            at = f" (at line {where.line + 1}, column {where.column + 1})" if where else ""
            problem = getattr(e, "problem", None) or type(e).__name__
            raise ConfigError(f"config file {path}: not valid YAML: {problem}{at}") from None
    if path.suffix == ".json":
        try:
            return json.loads(text)
        except json.JSONDecodeError as e:
            raise ConfigError(f"config file {path}: not valid JSON: {e.msg} (at line "
                              f"{e.lineno}, column {e.colno})") from None
    raise ConfigError(f"config file {path}: use .toml, .yaml/.yml or .json")


def load_file(path: str | Path) -> dict:
    """A config file as a dict of sections; names the file and the problem when it is not."""
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"config file {path} is a directory; give a .toml, .yaml or .json file")
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist")
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"config file {path} cannot be read as text: {e}") from None
    data = _parse_file(path, text)
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path}: expected keys and sections at the top level "
                          f"(e.g. steps = 10), got a {type(data).__name__}")
    return data


def build_config(preset: str = "default", file: str | Path | None = None,
                 overrides: list[str] | dict | None = None) -> Config:
    """Preset, then file, then overrides; fails on unknown keys before any work starts."""
    if preset not in PRESETS:
        raise ConfigError(f"unknown preset {preset!r}; choose one of {sorted(PRESETS)}"
                          f"{did_you_mean(preset, PRESETS)}")
    data = dict(PRESETS[preset])
    if file is not None:
        data = _merge(data, load_file(file))
    if overrides:
        over = overrides if isinstance(overrides, dict) else parse_overrides(overrides)
        data = _merge(data, over)
    return validate(data)


def _unknown_key(loc: str, value: Any) -> str:
    """'unknown key ...' with the closest valid key: the same name in another section first,
    then a near sibling in the same section, else the section's valid keys (never all)."""
    if loc in MOVED_KEYS:
        return (f"{loc!r} has moved to {MOVED_KEYS[loc]!r} (the algorithm section owns the "
                f"algorithm's knobs); set {MOVED_KEYS[loc]!r} instead")
    keys = _valid_keys(Config)
    names = set(keys) | {k.rsplit(".", 1)[0] for k in keys if "." in k}  # keys and sections
    parent, _, leaf = loc.rpartition(".")
    what = "section" if isinstance(value, dict) else "key"
    siblings = sorted(n.rpartition(".")[2] for n in names if n.rpartition(".")[0] == parent)
    # the exact name in another section beats a near one here ('lr' -> trainer.lr); of several,
    # the first in the schema's order (trainer.lr before the optional sft.lr)
    elsewhere = [k for k in keys if k.rpartition(".")[2] == leaf and k != loc]
    if elsewhere:
        return f"unknown {what} {loc!r}; did you mean {elsewhere[0]!r}?"
    match = closest(leaf, siblings)
    if match:
        return f"unknown {what} {loc!r}; did you mean {(parent + '.' if parent else '') + match!r}?"
    where = f"in '{parent}'" if parent else "at the top level"
    return f"unknown {what} {loc!r}; valid keys {where}: {', '.join(siblings)}"


def _check_preset_engine(data: dict, settings: dict) -> None:
    """A preset's recommended engine must be registered, unless the user chose rollout.engine."""
    engine = settings.get("rollout", {}).get("engine")
    chosen = isinstance(data.get("rollout"), dict) and "engine" in data["rollout"]
    if engine is None or chosen or engine in engines.names():
        return
    name = data["model"]["preset"]
    raise ConfigError(f"model.preset={name!r} ({presets.get(name).params / 1e9:.2f}B "
                      f"parameters) recommends rollout.engine={engine!r}, which this install "
                      f"does not register (engines: {engines.names()}); set rollout.engine "
                      "yourself, e.g. rollout.engine='torch'")


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def as_config(config: Config | dict | str | Path | None) -> Config:
    """A Config from a Config, a dict, a config file's path, or None (the embedded default)."""
    if config is None:
        return build_config()
    if isinstance(config, Config):
        return config
    if isinstance(config, dict):
        return validate(config)
    return build_config(file=config)


def _foreign_algorithm_keys(data: dict) -> list[str]:
    """Keys of a raw `algorithm` section that no algorithm has (the section allows extras: an
    algorithm's own options), for the loader's closest-key message."""
    section = data.get("algorithm")
    extra = [k for k in section if k not in AlgorithmConfig.model_fields] \
        if isinstance(section, dict) else []
    if not extra:
        return []
    own = {k for n in algorithms.names() for k in algorithms.get(n).Options.model_fields}
    try:  # a "module:Class" algorithm's own options
        own |= set(algorithms.get(section.get("name", "grpo")).Options.model_fields)
    except ValueError:
        pass  # an unknown name: the section's validator names it
    return [k for k in extra if k not in own]


def validate(data: dict) -> Config:
    foreign = _foreign_algorithm_keys(data)
    if foreign:
        raise ConfigError("invalid config: " + "; ".join(
            _unknown_key(f"algorithm.{k}", data["algorithm"][k]) for k in foreign))
    settings = preset_settings(data)
    _check_preset_engine(data, settings)
    data = _merge(settings, data)  # a model preset goes under the user's values
    try:
        return Config.model_validate(data)
    except ValidationError as e:
        problems = []
        for err in e.errors():
            loc = ".".join(str(p) for p in err["loc"])
            msg = err["msg"].removeprefix("Value error, ")
            if err["type"] == "extra_forbidden":
                problems.append(_unknown_key(loc, err["input"]))
            elif not loc:  # a check across sections
                problems.append(msg)
            elif err["type"] == "value_error":  # our validators name the value themselves
                problems.append(f"'{loc}': {msg}")
            else:
                problems.append(f"'{loc}': {msg} (got {_shown(err['input'])})")
        raise ConfigError("invalid config: " + "; ".join(problems)) from None


RUN_CONFIG = "config.json"


def run_config(run_dir: Path) -> Config:
    """The run's Config from its config.json."""
    return validate(run_config_data(run_dir))


def run_config_data(run_dir: Path) -> dict:
    """The run's config.json (the resolved config, every field written out) less the fields
    equal to the defaults, so they validate as unset, as the run had them. A key listed in
    `MOVED_KEYS` is read at its new place.
    """
    try:
        data = json.loads((run_dir / RUN_CONFIG).read_text())
    except json.JSONDecodeError as e:
        raise ConfigError(f"{run_dir / RUN_CONFIG} is not valid JSON ({e.msg})") from None
    return _non_default(upgrade(data), Config().model_dump(mode="json"))


def upgrade(data: dict) -> dict:
    """A run's config.json as this version reads it: moved keys at their new place, and the
    algorithm keys older versions wrote for every algorithm (PPO's, at their defaults) left
    out where the run's algorithm has no such option."""
    data = _moved(data)
    section = data.get("algorithm")
    if isinstance(section, dict):
        try:
            own = algorithms.get(section.get("name", "grpo")).Options.model_fields
        except ValueError:
            return data
        for k in [k for k in section if k not in AlgorithmConfig.model_fields and k not in own]:
            del section[k]
    return data


def _moved(data: dict) -> dict:
    data = json.loads(json.dumps(data))  # a copy
    for old, new in MOVED_KEYS.items():
        section, _, key = old.rpartition(".")
        if isinstance(data.get(section), dict) and key in data[section]:
            value = data[section].pop(key)
            new_section, _, new_key = new.rpartition(".")
            data.setdefault(new_section, {}).setdefault(new_key, value)
    return data


def _non_default(data: dict, default: dict) -> dict:
    out = {}
    for k, v in data.items():
        if isinstance(v, dict) and isinstance(default.get(k), dict):
            sub = _non_default(v, default[k])
            if sub:
                out[k] = sub
        elif k not in default or default[k] != v:
            out[k] = v
    return out
