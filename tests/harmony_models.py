"""Tiny harmony models (gpt-oss's chat format) whose greedy replies are scripted (holds no tests itself).

A real llama-architecture transformers folder (tests/scripted_models.py) whose vocabulary has harmony's
special tokens, as a gpt-oss GGUF's has, and a chat template that writes harmony messages, so the
engine picks the harmony format from the template (never from a file name). The scripted model's next
token depends on the current token only, so no token may come twice in a reply; a reply's second
message header (`<|start|>assistant<|channel|>final<|message|>` after the thinking's `<|end|>`)
therefore has its first special tokens as the real special tokens and the text after `<|start|>` as one
ordinary added token of the same text, which decodes to exactly what gpt-oss writes.
"""
from __future__ import annotations

from pathlib import Path

from engine.chat.harmony import SPECIAL_TOKENS

# a harmony template: pagedeck renders harmony chats itself (engine.chat.harmony_render); this one is only
# what the model file carries (it names tools and tool_calls, as gpt-oss's own template does)
TEMPLATE = ("{% for m in messages %}{% if m.role == 'assistant' %}<|start|>assistant<|channel|>final<|message|>"
            "{{ m.content }}<|end|>{% elif m.role != 'tool' %}<|start|>{{ m.role }}<|message|>{{ m.content }}<|end|>"
            "{% endif %}{% endfor %}{% if add_generation_prompt %}<|start|>assistant{% endif %}"
            "{# tools and tool_calls are rendered by the serving engine #}")

THOUGHT, ANSWER = "The user greets me, so I greet back.", "Hello there!"
THINK_THEN_ANSWER = ["<|channel|>", "analysis", "<|message|>", THOUGHT, "<|end|>", "<|start|>",
                     "assistant<|channel|>final<|message|>", ANSWER]
CALL_THOUGHT, CALL_ARGUMENTS = "I need the weather in Paris.", '{"city": "Paris"}'


def call_script(name: str = "get_weather", arguments: str = CALL_ARGUMENTS, thought: str = CALL_THOUGHT) -> list[str]:
    """Thinks, then calls `name` with `arguments` (JSON text) on the commentary channel."""
    return ["<|channel|>", "analysis", "<|message|>", thought, "<|end|>", "<|start|>",
            f"assistant<|channel|>commentary to=functions.{name} ", "<|constrain|>", "json<|message|>", arguments]


WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city now.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "The city"}},
                   "required": ["city"]}}}


def write_harmony_model(folder: str | Path, script: list[str], end: str = "<|return|>",
                        template: str | None = TEMPLATE) -> Path:
    """A scripted harmony model: its greedy reply to any chat is `script`, ended by `end` (a stop token);
    template None: the file carries no chat template (its vocabulary says harmony)."""
    from tests.scripted_models import write_scripted_model

    # (the prompt ends with `<|start|>assistant`, which the base vocabulary splits as "ass", "istant")
    return write_scripted_model(folder, script, template, start="istant", end=end, arch="llama",
                                special=SPECIAL_TOKENS)


def answer_model(folder: str | Path) -> Path:
    """Thinks on the analysis channel, then answers on the final channel."""
    return write_harmony_model(folder, THINK_THEN_ANSWER)


def call_model(folder: str | Path, name: str = "get_weather", arguments: str = CALL_ARGUMENTS) -> Path:
    """Thinks, then calls a function (get_weather(city="Paris")) on the commentary channel, ending with <|call|>."""
    return write_harmony_model(folder, call_script(name, arguments), end="<|call|>")
