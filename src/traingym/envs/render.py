"""Turn a dataset row's prompt, and an environment's later messages, into token ids with the
model's chat template."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class PromptRenderer:
    """Renders row['prompt'] (a string, or a list of chat messages) plus an assistant pre-fill."""

    tokenizer: Any
    prefill: str = ""
    system_prompt: str | None = None

    def __post_init__(self):
        if self.system_prompt is not None:
            self.check_system_prompt()

    def check_system_prompt(self) -> None:
        """Fail at once, with the fix, where the chat template refuses a system message
        (Gemma 1/2's raises 'System role not supported' from inside Jinja)."""
        try:
            self.render([{"role": "system", "content": self.system_prompt},
                         {"role": "user", "content": "-"}])
        except Exception as e:  # jinja2's TemplateError, or whatever the template raises
            raise ValueError(f"the model's chat template refuses task.system_prompt "
                             f"({type(e).__name__}: {e}): unset task.system_prompt, or put the "
                             f"instructions in the prompts (a template with no system role, "
                             f"e.g. Gemma 1/2)") from e

    def messages(self, example: dict[str, Any]) -> list[dict[str, str]]:
        prompt = example["prompt"]
        msgs = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
        if self.system_prompt is not None and msgs[0]["role"] != "system":
            msgs = [{"role": "system", "content": self.system_prompt}] + msgs
        return msgs

    def text(self, example: dict[str, Any]) -> str:
        return self.render(self.messages(example))

    def ids(self, example: dict[str, Any]) -> tuple[int, ...]:
        return self.encode(self.text(example))

    def render(self, messages: list[dict[str, Any]], tools: list[dict] | None = None) -> str:
        """A first prompt: the messages, the assistant header and the pre-fill."""
        text = self.tokenizer.apply_chat_template(
            messages, tools=tools, add_generation_prompt=True, tokenize=False)
        return text + self.prefill

    def encode(self, text: str) -> tuple[int, ...]:
        return tuple(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def continuation(self, messages: list[dict[str, Any]], stop_text: str | None) -> str:
        """The text that follows a policy turn when the environment says `messages`: the end
        of the assistant turn, the messages, and the next assistant header (no pre-fill).

        Rendered with the chat template after a stand-in assistant turn; the text after the
        stand-in is the continuation. `stop_text` is the decoded stop token the policy's turn
        already ended with (None when it was cut at max_new_tokens): it must be how the
        template ends an assistant turn, and is cut so it is not written twice.
        """
        stand_in = "\x00TRAINGYM_TURN\x00"
        head = [{"role": "user", "content": "-"}, {"role": "assistant", "content": stand_in}]
        full = self.tokenizer.apply_chat_template(
            head + list(messages), add_generation_prompt=True, tokenize=False)
        if full.count(stand_in) != 1:
            raise ValueError("the chat template does not render an assistant message's content "
                             "verbatim; multi-turn rendering needs it to")
        after = full.split(stand_in, 1)[1]
        if stop_text is not None:
            if not after.startswith(stop_text):
                raise ValueError(f"the policy's turn ended with stop token {stop_text!r}, but "
                                 f"the chat template ends an assistant turn with {after[:20]!r}; "
                                 "use the template's end-of-turn token as the stop token")
            after = after[len(stop_text):]
        return after
