"""One terminal chat with a model loaded in this process: the history, the sampler settings, and a reply
streamed as (reasoning, content) pieces, through the engine's public API (engine.load_model_and_tokenizer,
PagedCache, DynamicGenerator, DynamicJob) and its reasoning parser (engine.chat.reasoning).

The generator keeps its cache between turns, so each turn's prompt reuses the pages of the history already
computed (the engine's prefix caching). When the history outgrows the cache the oldest turns are dropped
(the system prompt stays), as Ollama does when a chat exceeds its context, until a quarter of the context (or
the reply limit, if smaller) is left for the reply. A reply has no limit of its own unless one is set: it may
fill the context, as `ollama run` and llama-server allow, so a thinking model can think at length.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

from engine.chat.reasoning import HARMONY, reasoning_markers, starts_in_reasoning
from engine.chat.reply import ReplyParser
from engine.contract import DEFAULT_PAGE_SIZE, SamplerSettings


@dataclass
class Options:
    """What /set changes: sampler settings, seed, reply length, system prompt, whether thinking is shown,
    whether a reply that repeats itself is stopped."""
    sampler: SamplerSettings = field(default_factory=SamplerSettings)
    seed: int | None = None
    max_tokens: int | None = None  # None: until the context is full
    system: str | None = None
    show_thinking: bool = False
    stop_on_loops: bool = True  # end a reply stuck repeating itself (the engine's LoopGuard), as the app does
    verbose: bool = False  # token counts and speed after each reply


@dataclass
class Reply:
    """A finished reply: its answer, its reasoning (folded by default) and the engine's counts."""
    content: str = ""
    reasoning: str = ""
    new_tokens: int = 0
    prompt_tokens: int = 0
    eos_reason: str = ""
    seconds: float = 0.0


class ChatSession:
    """Load `path` (None: the embedded SmolLM2-135M-Instruct) with a cache of `ctx` tokens."""

    def __init__(self, path: str | Path | None, ctx: int = 4096, weights: str = "auto",
                 options: Options | None = None) -> None:
        import engine

        self.model, self.tokenizer = engine.load_model_and_tokenizer(path, weights=weights)
        self.chat_format = self.tokenizer.set_chat_format("auto")
        ctx = min(ctx, self.model.config.max_seq_len)
        self.ctx = max(DEFAULT_PAGE_SIZE, ctx // DEFAULT_PAGE_SIZE * DEFAULT_PAGE_SIZE)
        self.cache = engine.PagedCache(self.model, max_tokens=self.ctx, page_size=DEFAULT_PAGE_SIZE)
        self.generator = engine.DynamicGenerator(self.model, self.cache, self.tokenizer)
        # (a harmony model, gpt-oss: its analysis channel is the thinking)
        self.markers = HARMONY if self.chat_format.harmony else reasoning_markers(self.tokenizer.chat_template)
        self.options = options or Options()
        self.history: list[dict] = []
        self.last: Reply | None = None
        self.turn_started = 0.0  # when the reply in progress was asked for

    def clear(self) -> None:
        self.history.clear()

    def _prompt_ids(self, user: str):
        """The rendered prompt of the history plus `user`, oldest turns dropped until it leaves a quarter of the
        context (or the reply limit, if smaller) for the reply; ValueError when the message alone leaves no room
        for 16 tokens (or the limit, if smaller)."""
        system = [{"role": "system", "content": self.options.system}] if self.options.system else []
        turns = self.history + [{"role": "user", "content": user}]
        limit = self.options.max_tokens or self.ctx
        while True:
            text = self.tokenizer.apply_chat_template(system + turns, add_generation_prompt=True)
            ids = self.tokenizer.encode(text, encode_special_tokens=True)
            room = min(self.ctx, self.model.config.max_seq_len) - ids.shape[1]
            if room >= min(limit, self.ctx // 4) or (len(turns) <= 1 and room >= min(limit, 16)):
                return text, ids, room
            if len(turns) <= 1:
                raise ValueError(f"the message is {ids.shape[1]} tokens; the context holds {self.ctx} "
                                 "(start with a larger --ctx)")
            turns = turns[2:] if len(turns) > 2 else turns[1:]
            self.history[:] = turns[:-1]

    def send(self, user: str):
        """Generate the reply to `user`, yielding (reasoning delta, content delta) as tokens come; the finished
        reply is in `last` and the history. Closing the generator early (Ctrl-C) cancels the job and keeps
        what was said so far."""
        import time

        import engine

        text, ids, room = self._prompt_ids(user)
        parser = ReplyParser(self.markers, in_reasoning=starts_in_reasoning(text, self.markers))
        job = engine.DynamicJob(ids, min(self.options.max_tokens or room, room), gen_settings=self.options.sampler,
                                seed=self.options.seed, stop_conditions=sorted(self.tokenizer.stop_token_ids),
                                decode_special_tokens=self.markers is not None,
                                stop_on_loops=self.options.stop_on_loops)
        reply, t0, done = Reply(prompt_tokens=ids.shape[1]), time.perf_counter(), False
        self.turn_started = t0
        self.generator.enqueue(job)
        try:
            while not done:
                for r in self.generator.iterate():
                    if r.get("stage") != "streaming":
                        continue
                    if r.get("text"):
                        delta = parser.feed(r["text"])
                        if delta.reasoning or delta.content:
                            yield delta.reasoning, delta.content
                    if r.get("eos"):
                        done = True
                        reply.new_tokens, reply.eos_reason = r.get("new_tokens", 0), str(r.get("eos_reason", ""))
            tail = parser.finish()
            if tail.reasoning or tail.content:
                yield tail.reasoning, tail.content
        finally:
            if not done and self.generator.num_remaining_jobs():
                self.generator.cancel(job)
                reply.eos_reason = "cancelled"
            reply.content, reply.reasoning = parser.content, parser.reasoning
            reply.seconds = time.perf_counter() - t0
            self.history += [{"role": "user", "content": user}, {"role": "assistant", "content": reply.content}]
            self.last = reply

    def set_option(self, name: str, value: str) -> str:
        """/set NAME VALUE: change one option; returns what is now set, ValueError on a bad name or value."""
        o = self.options
        if name == "system":
            o.system = value or None
            return f"system prompt {'set' if value else 'cleared'}"
        if name in ("think", "nothink"):
            o.show_thinking = name == "think"
            return "thinking is " + ("shown" if o.show_thinking else "folded")
        if name in ("loops", "noloops"):
            o.stop_on_loops = name == "noloops"
            return "a reply that repeats itself is " + ("stopped" if o.stop_on_loops else "let run")
        if name in ("verbose", "quiet"):
            o.verbose = name == "verbose"
            return "token counts are " + ("shown" if o.verbose else "hidden")
        if not value:
            raise ValueError(f"/set {name} needs a value")
        if name == "seed":
            o.seed = int(value)
        elif name in ("max_tokens", "num_predict"):  # none (or ollama's -1): until the context is full
            o.max_tokens = None if value.lower() in ("none", "-1") else int(value)
            if o.max_tokens is not None and o.max_tokens < 1:
                raise ValueError("max_tokens must be at least 1, or none (until the context is full)")
        elif name in SAMPLER_NAMES:
            field_name, kind = SAMPLER_NAMES[name]
            sampler = replace(o.sampler, **{field_name: kind(value)})
            sampler.validate()
            o.sampler = sampler
        else:
            raise ValueError(f"unknown setting {name!r}; /help lists them")
        return f"set {name} to {value}"


SAMPLER_NAMES = {"temperature": ("temperature", float), "top_k": ("top_k", int), "top_p": ("top_p", float),
                 "min_p": ("min_p", float), "repeat_penalty": ("token_repetition_penalty", float)}
