"""gpt-oss's harmony chat format: which models use it, its special tokens, and the reasoning effort.

A harmony conversation is a run of messages, each
`<|start|>{role}<|channel|>{channel} to={recipient} <|constrain|>{type}<|message|>{content}` closed by
`<|end|>` (the message is done, the turn goes on), `<|call|>` (a tool call: the model stops for the
result) or `<|return|>` (the reply is done). A reply writes its thinking to the `analysis` channel, its
answer to `final`, and calls to the `commentary` channel addressed `to=functions.NAME`, with the
arguments as JSON. pagedeck shows the analysis as the reply's thinking (`reasoning_content` on the
server), the final channel as its answer and the calls as OpenAI `tool_calls`.

Which model uses it is read off its chat template or, without one, its vocabulary: the special tokens
`<|channel|>` and `<|message|>` (never its file name).

Why pagedeck renders and parses harmony itself (engine.chat.harmony_render, engine.chat.harmony_parser)
instead of through the `openai-harmony` package's encoder: `load_harmony_encoding` needs the
`o200k_base.tiktoken` vocabulary file, which it downloads on first use (or reads from the folder named
by TIKTOKEN_ENCODINGS_BASE, checked against a fixed hash, or from TIKTOKEN_RS_CACHE_DIR's cache), and
no package on PyPI ships that file; pagedeck never downloads at start-up. Its encoder would also number
tokens by o200k, while the ids a model reads are its own vocabulary's (a gpt-oss GGUF carries the
harmony special tokens in it), which pagedeck's tokenizer owns. So the package's message types
(Message, Role, SystemContent, DeveloperContent, ToolDescription, ReasoningEffort) describe the
conversation, and the text is rendered here and tokenized by the model's own tokenizer; the reply's
text (decoded with its special tokens) is parsed here too.
"""
from __future__ import annotations

from typing import Any

START, END, MESSAGE, CHANNEL = "<|start|>", "<|end|>", "<|message|>", "<|channel|>"
CONSTRAIN, CALL, RETURN = "<|constrain|>", "<|call|>", "<|return|>"
# every special token of the format (a reply is decoded with them: its structure is made of them)
SPECIAL_TOKENS = (START, END, MESSAGE, CHANNEL, CONSTRAIN, CALL, RETURN)
# a reply ends at these: the answer is done, or a tool call waits for its result (`<|end|>` only ends a message)
STOP_TOKENS = (RETURN, CALL)
# what marks a vocabulary or a template as harmony's
MARKERS = (CHANNEL, MESSAGE)

REASONING_EFFORTS = ("low", "medium", "high")
DEFAULT_REASONING_EFFORT = "medium"


def uses_harmony(template: str | None) -> bool:
    """Whether a chat template writes harmony messages (gpt-oss's own template does)."""
    return bool(template) and all(m in template for m in MARKERS)


def harmony_vocabulary(has_token: Any) -> bool:
    """Whether a vocabulary has harmony's message tokens (has_token: str -> bool)."""
    return all(has_token(t) for t in (START, END, *MARKERS))


def check_reasoning_effort(value: Any, name: str = "reasoning_effort") -> str:
    """`value` if it is a reasoning effort (low, medium, high), else ValueError naming `name`."""
    if value not in REASONING_EFFORTS:
        raise ValueError(f"{name} must be one of {', '.join(REASONING_EFFORTS)}, got {value!r}")
    return value
