"""ReplyDelta: what one piece of a streaming reply adds (thinking, answer text, tool calls and their
streamed pieces), as every reply parser hands it out (engine.chat.reply, engine.chat.harmony_parser)."""
from __future__ import annotations

from dataclasses import dataclass, field

from .tool_call_pieces import ToolCallPiece
from .tool_calls import ToolCall


@dataclass
class ReplyDelta:
    """What one piece of the reply adds: thinking text, answer text, complete tool calls, and the calls'
    streamed pieces (engine.chat.tool_call_pieces: a call's name first, then its arguments as written)."""

    reasoning: str = ""
    content: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    call_pieces: list[ToolCallPiece] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.reasoning or self.content or self.tool_calls)
