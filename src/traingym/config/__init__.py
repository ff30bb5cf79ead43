"""The run's whole config: `Config` composes the sections (schema.py), rules.py checks what spans
sections, load.py reads files, `--set` overrides and presets. Imported only from above (the
loop, the features and the entry points); a component takes its own section."""

from traingym.config.load import build_config, validate
from traingym.config.schema import PRESETS, Config
from traingym.core.errors import ConfigError

__all__ = ["PRESETS", "Config", "ConfigError", "build_config", "validate"]
