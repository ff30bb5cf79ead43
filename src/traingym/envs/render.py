"""Turn a dataset row's prompt into token ids with the model's chat template."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class PromptRenderer:
    """Renders row['prompt'] (a string, or a list of chat messages) plus an assistant pre-fill."""

    tokenizer: Any
    prefill: str = ""
    system_prompt: str | None = None

    def messages(self, example: dict[str, Any]) -> list[dict[str, str]]:
        prompt = example["prompt"]
        msgs = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
        if self.system_prompt is not None and msgs[0]["role"] != "system":
            msgs = [{"role": "system", "content": self.system_prompt}] + msgs
        return msgs

    def text(self, example: dict[str, Any]) -> str:
        text = self.tokenizer.apply_chat_template(
            self.messages(example), add_generation_prompt=True, tokenize=False)
        return text + self.prefill

    def ids(self, example: dict[str, Any]) -> tuple[int, ...]:
        return tuple(self.tokenizer(self.text(example), add_special_tokens=False)["input_ids"])
