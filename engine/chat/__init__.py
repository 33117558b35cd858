"""Chat-level text conventions shared by the server and the app, importable without torch.

What a model's reply means beyond its text: thinking (reasoning) told apart from the answer, tool calls
in the model's own format, the grammar that forces a call, and the message list a chat template can
render (tool calls and results included), and chats with images (image_prompt: messages shaped for a VLM
template, each family's image markers expanded as its HF processor does).
"""
from .image_prompt import FAMILIES, GEMMA3, IDEFICS3, ImageFamily, image_family, split_images
from .reasoning import (
    HARMONY, KNOWN_MARKERS, MISTRAL_THINK, THINK, ReasoningMarkers, ReasoningParser, reasoning_markers, split_reasoning,
    starts_in_reasoning, supports_thinking_switch,
)
from .reply import ReplyDelta, ReplyParser, split_reply
from .template_messages import (
    render_kwargs, template_knows_tool_calls, template_knows_tools, template_messages, tools_system_prompt,
)
from .tool_call_pieces import ToolCallPiece
from .tool_calls import FORMATS, ToolCall, ToolCallFormat, ToolCallParser, parse_tool_calls, tool_call_format
from .tool_grammar import tool_choice_grammar

__all__ = [
    "FAMILIES", "GEMMA3", "IDEFICS3", "ImageFamily", "image_family", "split_images",
    "FORMATS", "HARMONY", "KNOWN_MARKERS", "MISTRAL_THINK", "THINK", "ReasoningMarkers", "ReasoningParser", "ReplyDelta", "ReplyParser",
    "ToolCall", "ToolCallPiece",
    "ToolCallFormat", "ToolCallParser", "parse_tool_calls", "reasoning_markers", "render_kwargs",
    "split_reasoning", "split_reply", "starts_in_reasoning", "supports_thinking_switch", "template_knows_tool_calls",
    "template_knows_tools", "template_messages", "tool_call_format", "tool_choice_grammar",
    "tools_system_prompt",
]
