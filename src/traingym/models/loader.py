"""Load a policy model and its tokenizer: the embedded default, a tiny test model, or any local
Hugging Face causal-LM folder. Nothing is fetched from a hub.
"""

from __future__ import annotations

from pathlib import Path

import torch

from traingym.models.embedded import embedded_model_dir

CHAT_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content']"
    " + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def tiny_tokenizer(vocab_size: int = 512):
    """A byte-level BPE tokenizer trained in well under a second on arithmetic-like text."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    lines = [f"What is {a} + {b}? The answer is {a + b}." for a in range(20) for b in range(20)]
    lines += [f"What is {a} - {b}? What is {a} * {b}? {a * b} {a - b}"
              for a in range(20) for b in range(20)]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(lines * 5, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|im_start|>",
                                   eos_token="<|im_end|>", pad_token="<|im_end|>",
                                   unk_token="<|endoftext|>")
    fast.chat_template = CHAT_TEMPLATE
    return fast


def tiny_model(tokenizer, seed: int = 0):
    """A 0.1M-parameter Llama (101,824 with the 512-token tokenizer), deterministic for a
    given seed."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
        tie_word_embeddings=True, pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.bos_token_id,
    )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return LlamaForCausalLM(config)


def check_model_path(path: str) -> None:
    """Fail fast, before any work, on a model.path that is no model folder (cheap: loads
    nothing; 'embedded' and 'tiny' always pass)."""
    if path in ("tiny", "embedded"):
        return
    folder = Path(path).expanduser()
    if not (folder / "config.json").is_file():
        raise FileNotFoundError(
            f"model.path={path!r}: not a Hugging Face model folder (no config.json); use "
            "'embedded', 'tiny', or a local folder saved with save_pretrained"
        )


def resolve_path(path: str) -> Path | None:
    """'embedded' -> the cached embedded folder; 'tiny' -> None; else a local folder."""
    if path == "tiny":
        return None
    if path == "embedded":
        return embedded_model_dir()
    check_model_path(path)
    return Path(path).expanduser()


def load_policy(path: str, seed: int = 0, dtype: torch.dtype = torch.float32):
    """Return (model, tokenizer), the model's parameters in `dtype` (fp32 by default; a bf16
    load rounds as fp32 then `.to(bfloat16)` would, without the fp32 copy; buffers such as the
    rotary frequencies stay as the model makes them)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    folder = resolve_path(path)
    if folder is None:
        tok = tiny_tokenizer()
        model = tiny_model(tok, seed)
        for p in model.parameters():
            p.data = p.data.to(dtype)
        return model, tok
    tok = AutoTokenizer.from_pretrained(folder)
    hf_logging.disable_progress_bar()
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype)
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return model, tok
