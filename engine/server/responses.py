"""OpenAI response objects from job results: completions, stream chunks, usage and logprobs.

Logprobs are the model's own distribution (log-softmax of the raw logits the job returns), as vLLM
reports them by default, not the sampler's truncated one: after top-k or greedy truncation almost every
alternative would be -inf, which JSON can't even carry.

Chat replies are read by engine.chat's ReplyParser when the request has tools or the template has think
markers: thinking goes to `reasoning_content` (vLLM's field), calls to `tool_calls` (finish_reason
"tool_calls"), the rest to `content`; streamed, each part is a delta of its own field as soon as it is
decided, so text that might still become a call marker waits for the next token. Calls stream as OpenAI
and vLLM stream them: a first `tool_calls` delta with the call's index, id, type and name (arguments
empty), then deltas with only the index and the next piece of the arguments as the model writes them. A
call written as plain JSON (no markers: engine.chat.json_tool_calls) is a call only once the reply ends
with it, so it comes whole, in one delta with the last tokens; its JSON is never sent as content.
"""
from __future__ import annotations

import time
import uuid
from typing import Any

import torch

from ..chat import ReplyDelta, ReplyParser, ToolCallPiece
from .requests import GenerationRequest

# OpenAI has no finish_reason for a reply stopped as a loop: it ended on purpose, before its length limit.
FINISH_REASONS = {"stop_token": "stop", "stop_string": "stop", "end_filter": "stop", "max_new_tokens": "length",
                  "repetition": "stop"}


def request_id(kind: str) -> str:
    return ("chatcmpl-" if kind == "chat" else "cmpl-") + uuid.uuid4().hex[:24]


class ResponseBuilder:
    """Accumulates one job's results and renders them as OpenAI objects (whole or as stream chunks).

    A request with n choices has one builder per choice (`choices`): they share the id, and the whole
    response and the usage cover all of them (the prompt counted once, the completions summed)."""

    def __init__(self, req: GenerationRequest, rid: str, tokenizer: Any, index: int = 0,
                 siblings: list[ResponseBuilder] | None = None):
        self.req = req
        self.id = rid
        self.index = index
        self.siblings = siblings if siblings is not None else [self]  # every choice's builder, in order
        self.created = int(time.time())
        self.tok = tokenizer
        self.text = ""
        self.logprobs: list[dict] = []  # one entry per generated token
        self.finish_reason: str | None = None
        self.prompt_tokens = int(req.input_ids.shape[1])
        self.completion_tokens = 0
        self.cached_tokens = 0
        plan = req.plan
        self.reply = ReplyParser(plan.markers, in_reasoning=plan.in_reasoning, tool_format=plan.tool_format,
                                 parallel=plan.parallel, tool_names=plan.tool_names) \
            if plan is not None and (plan.markers is not None or plan.tool_format is not None) else None
        self.delta = ReplyDelta()  # what the last feed() added, split into reasoning, content and calls

    # ---- feeding ---------------------------------------------------------------------------------
    def feed(self, r: dict) -> tuple[str, list[dict]]:
        """Take one streaming result; returns (new text, new logprob entries)."""
        text = r.get("text", "")
        ids = r.get("token_ids") or []
        self.completion_tokens += len(ids)
        new_lp = self._token_logprobs(ids, r.get("logits")) if self.req.logprobs is not None and ids else []
        self.text += text
        self.logprobs += new_lp
        if self.reply is None:
            self.delta = ReplyDelta(content=text)
        else:
            self.delta = self.reply.feed(text)
            if r.get("eos"):
                last = self.reply.finish()
                self.delta = ReplyDelta(self.delta.reasoning + last.reasoning, self.delta.content + last.content,
                                        self.delta.tool_calls + last.tool_calls,
                                        self.delta.call_pieces + last.call_pieces)
        if r.get("eos"):
            reason = r.get("eos_reason")
            self.finish_reason = FINISH_REASONS.get(reason, reason)
            if self.reply is not None and self.reply.tool_calls:
                self.finish_reason = "tool_calls"
            self.completion_tokens = int(r.get("new_tokens", self.completion_tokens))
            self.cached_tokens = int(r.get("cached_tokens") or 0)
        return text, new_lp

    def _token_logprobs(self, ids: list[int], logits: torch.Tensor | None) -> list[dict]:
        if logits is None or logits.shape[0] != len(ids):
            raise RuntimeError("the job returned no logits for its tokens (return_logits was not set)")
        lp = torch.log_softmax(logits.float(), dim=-1)
        k = self.req.logprobs
        out = []
        for row, tok in zip(lp, ids):
            top = torch.topk(row, k) if k else None
            out.append({"id": int(tok), "logprob": float(row[tok]),
                        "top": [(int(i), float(v)) for v, i in zip(top.values, top.indices)] if top else []})
        return out

    # ---- rendering -------------------------------------------------------------------------------
    @classmethod
    def choices(cls, req: GenerationRequest, rid: str, tokenizer: Any) -> list[ResponseBuilder]:
        """One builder per choice of the request (req.n)."""
        group: list[ResponseBuilder] = []
        group += [cls(req, rid, tokenizer, i, group) for i in range(req.n)]
        return group

    def usage(self) -> dict:
        """The request's usage: its prompt once (and the part of it the first choice found in the cache:
        the other choices reuse what it computed), every choice's completion tokens summed."""
        completion = sum(b.completion_tokens for b in self.siblings)
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": completion,
                "total_tokens": self.prompt_tokens + completion,
                "prompt_tokens_details": {"cached_tokens": self.siblings[0].cached_tokens}}

    def _piece(self, tok: int) -> dict:
        raw = self.tok.token_bytes(tok)
        return {"token": raw.decode("utf-8", errors="replace"), "bytes": list(raw)}

    def chat_logprobs(self, entries: list[dict]) -> dict | None:
        if self.req.logprobs is None:
            return None
        return {"content": [{**self._piece(e["id"]), "logprob": e["logprob"],
                             "top_logprobs": [{**self._piece(t), "logprob": v} for t, v in e["top"]]}
                            for e in entries]}

    def completion_logprobs(self, entries: list[dict], offset: int) -> dict | None:
        if self.req.logprobs is None:
            return None
        tokens, offsets = [], []
        for e in entries:
            tokens.append(self._piece(e["id"])["token"])
            offsets.append(offset)
            offset += len(tokens[-1])
        return {"tokens": tokens, "token_logprobs": [e["logprob"] for e in entries],
                "top_logprobs": [{self._piece(t)["token"]: v for t, v in e["top"]} for e in entries],
                "text_offset": offsets}

    def final(self) -> dict:
        """The whole (non-streamed) response, with every choice."""
        obj = "chat.completion" if self.req.kind == "chat" else "text_completion"
        return {"id": self.id, "object": obj, "created": self.created, "model": self.req.model,
                "choices": [b.choice() for b in self.siblings], "usage": self.usage()}

    def choice(self) -> dict:
        """This choice in the whole response."""
        if self.req.kind == "chat":
            return {"index": self.index, "message": self._message(),
                    "logprobs": self.chat_logprobs(self.logprobs), "finish_reason": self.finish_reason}
        text = (self.req.prompt + self.text) if self.req.echo else self.text
        start = len(self.req.prompt) if self.req.echo else 0
        return {"index": self.index, "text": text, "logprobs": self.completion_logprobs(self.logprobs, start),
                "finish_reason": self.finish_reason}

    def _message(self) -> dict:
        if self.reply is None:
            return {"role": "assistant", "content": self.text}
        calls = self.reply.tool_calls
        message: dict[str, Any] = {"role": "assistant", "content": self.reply.content or (None if calls else "")}
        if self.req.plan.tool_format is not None:
            message["tool_calls"] = [c.to_openai() for c in calls]
        if self.req.plan.markers is not None:
            message["reasoning_content"] = self.reply.reasoning or None
        return message

    def chunk(self, text: str | None = None, logprobs: list[dict] | None = None, finish: bool = False,
              first: bool = False, text_offset: int = 0, reasoning: str | None = None,
              tool_calls: list[ToolCallPiece] | None = None) -> dict:
        """One stream chunk: the role chunk (first), a text, reasoning or tool-call delta (pieces of calls),
        or the finish chunk."""
        finish_reason = self.finish_reason if finish else None
        if self.req.kind == "chat":
            delta: dict[str, Any] = {"role": "assistant", "content": ""} if first else {}
            if text is not None:
                delta["content"] = text
            if reasoning is not None:
                delta["reasoning_content"] = reasoning
            if tool_calls:
                delta["tool_calls"] = [p.to_openai() for p in tool_calls]
            choice = {"index": self.index, "delta": delta,
                      "logprobs": self.chat_logprobs(logprobs) if logprobs else None, "finish_reason": finish_reason}
            obj = "chat.completion.chunk"
        else:
            choice = {"index": self.index, "text": text or "",
                      "logprobs": self.completion_logprobs(logprobs, text_offset) if logprobs else None,
                      "finish_reason": finish_reason}
            obj = "text_completion"
        out = {"id": self.id, "object": obj, "created": self.created, "model": self.req.model, "choices": [choice]}
        if self.req.include_usage:
            out["usage"] = self.usage() if self.req.continuous_usage else None
        return out

    def usage_chunk(self) -> dict:
        """The last chunk of a stream with include_usage: no choices, the request's usage."""
        obj = "chat.completion.chunk" if self.req.kind == "chat" else "text_completion"
        return {"id": self.id, "object": obj, "created": self.created, "model": self.req.model, "choices": [],
                "usage": self.usage()}
