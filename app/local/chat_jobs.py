"""EngineService's chat replies: a chat's prompt encoded for its model, its job started, counted, cancelled.

Each reply is a DynamicJobAsync on the generator of the model the chat's settings name (the main one, or
one beside it: app.local.model_slots). The running jobs are kept by chat (`_jobs`), so a chat has at most
one reply running, a load can wait until none runs, and a retired generator's replies are cancelled.
The state (`_jobs`, `_prompt`, the loaded model) is EngineService's.

Each job starts with its reply's rank (app.core.priorities: the focused chat first, then the other chats,
extra replies, batch rows and API requests, in the order the preferences give); when the focus moves,
`focus_chat` re-ranks the running replies whose rank changed, on their generator's worker thread, so the one
the user now looks at keeps its pages and a reply left behind is the one that gives them back.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Any

from app.core.priorities import Priorities
from app.core.store import ChatSettings
from app.core.tasks import spawn
from app.local.chat_prompt import ChatPrompt, has_images, prompt_text
from app.local.model_slots import ModelNotLoaded
from app.preferences.preferences import Preferences

log = logging.getLogger(__name__)


class ChatJobs:
    """The Backend's prompt and job members of EngineService."""

    ranks_replies = True  # Backend: start_job ranks each reply and focus_chat re-ranks the running ones

    @property
    def priorities(self) -> Priorities:
        """The replies' ranks, in the order the preferences give now (read at each start and focus change)."""
        p = self.__dict__.get("_priorities")
        if p is None:
            p = self.__dict__["_priorities"] = Priorities()
        p.set_order(Preferences().reply_order)
        return p

    def focus_chat(self, chat_id: Any, compared: Any = ()) -> None:
        """The chat the user looks at now (and the chats compared beside it): running replies whose rank
        changed are re-ranked from the generator's next step."""
        p = self.priorities
        p.focus(chat_id, compared)
        for identifier, job in list(self._jobs.items()):
            rank = p.priority(identifier)
            if rank != job.job.priority:
                spawn(self._rerank(job, rank))

    @staticmethod
    async def _rerank(job: Any, priority: int) -> None:
        try:
            await job.generator.run_on_worker(lambda g: g.set_priority(job.job, priority))
        except RuntimeError as exc:  # the generator closed meanwhile (a reload): its replies were stopped
            log.debug("reply %s not re-ranked: %s", job.identifier, exc)

    async def _until_idle(self) -> None:
        while self._jobs:
            self._idle = asyncio.get_running_loop().create_future()
            await self._idle

    def _forget_job(self, identifier: Any):
        job = self._jobs.pop(identifier, None)
        if not self._jobs and self._idle is not None and not self._idle.done():
            self._idle.set_result(None)
        return job

    def prompt_ids(self, history: list[dict], settings: ChatSettings, tools: list[dict] | None = None):
        """Chat template over system prompt + history, encoded (the (1, n) ids go straight to the job).
        A trailing assistant message is continued: its text follows the generation prompt, unclosed.

        The last history encoded is kept (app.local.chat_prompt): fitting a chat into the context asks
        for that history less its oldest turns, and the job for the one it kept, and those ids are cut
        from it, so a send tokenizes its prompt once."""
        return self._prompt_of(history, settings, tools)[0]

    def _prompt_of(self, history: list[dict], settings: ChatSettings, tools: list[dict] | None = None):
        """(ids, image embeddings or None): a history with images on a model that sees them goes through
        its vision encoder (engine.image_prompt); otherwise the text prompt (images ignored: with_images
        already turned them into notes for a text-only model)."""
        tokenizer = self._engine_of(settings)[0]
        if tokenizer is None:
            raise RuntimeError("no model is loaded yet")
        vision = self._vision_of(settings)
        if vision is not None and has_images(history):
            return self._image_prompts.of(tokenizer, vision, history, settings, tools)
        return self._text_ids(tokenizer, history, settings, tools), None

    async def prepare_images(self, history: list[dict], settings: ChatSettings, tools: list[dict] | None = None) -> None:
        """Make a history's image prompt on a worker thread (app.local.image_prompts) for the count and job."""
        try:
            tokenizer = self._engine_of(settings)[0]
        except ModelNotLoaded:
            return  # start_job says which model is missing
        vision = self._vision_of(settings)
        if tokenizer is not None and vision is not None and has_images(history):
            await self._image_prompts.prepare(tokenizer, vision, history, settings, tools)

    def _text_ids(self, tokenizer: Any, history: list[dict], settings: ChatSettings, tools: list[dict] | None):
        last = self._prompt
        if last is not None and last.tokenizer is tokenizer:
            ids = last.ids_of(history, settings, tools)
            if ids is not None:
                return ids
        self._prompt = ChatPrompt(tokenizer, history, settings, tools)
        return self._prompt.ids

    continues_replies = True  # prompt_ids continues a trailing assistant message (ChatSession.continue_reply)
    runs_tools = True  # the chat template renders the tools; the chat parses the model's calls from its text

    def count_tokens(self, history: list[dict], settings: ChatSettings, tools: list[dict] | None = None) -> int | None:
        """Prompt tokens of that history; None before a model is loaded."""
        try:
            tokenizer = self._engine_of(settings)[0]
        except ModelNotLoaded:
            return None  # the send says which model is missing
        if tokenizer is None:
            return None
        return self.prompt_ids(history, settings, tools).shape[-1]

    def chat_template(self, settings: ChatSettings | None = None) -> str | None:
        """The chat template source of the chat's model (None before it is loaded)."""
        try:
            tokenizer = self._engine_of(settings)[0]
        except ModelNotLoaded:
            return None
        return tokenizer.chat_template if tokenizer is not None else None

    def render_prompt(self, history: list[dict], settings: ChatSettings, tools: list[dict] | None = None) -> str | None:
        """The prompt's text (a reasoning template may end it inside an open think block)."""
        tokenizer = self._engine_of(settings)[0]
        if tokenizer is None:
            return None
        return prompt_text(tokenizer, history, settings, tools)

    def context_limit(self, settings: ChatSettings | None = None) -> int | None:
        """The most tokens one reply's sequence may hold (prompt + reply) on the chat's model; None before
        a model is loaded (or when the chat's model is not loaded)."""
        try:
            generator = self._engine_of(settings)[1]
        except ModelNotLoaded:
            return None
        return generator.max_seq_len if generator is not None else None

    def start_job(self, identifier: Any, history: list[dict], settings: ChatSettings, tools: list[dict] | None = None):
        """Enqueue one reply; returns (job, prompt token count). Must run on the event loop."""
        if self.generator is None:
            raise RuntimeError("no model is loaded yet" if not self.loading else "the model is still loading")
        if identifier in self._jobs:
            raise RuntimeError(f"chat {identifier} already has a reply running")
        import engine

        tokenizer, generator = self._engine_of(settings)
        ids, embeddings = self._prompt_of(history, settings, tools)
        stops = sorted(tokenizer.stop_token_ids) + list(settings.stop_strings)
        gen_settings = settings.sampler_settings()

        loras = None if settings.loras is None else [tuple(pair) for pair in settings.loras]
        filters = self._filters(settings)
        job = engine.DynamicJobAsync(  # a ValueError names an adapter that isn't loaded
            generator, input_ids=ids, max_new_tokens=settings.max_new_tokens, gen_settings=gen_settings,
            seed=settings.seed, stop_conditions=stops, identifier=identifier, loras=loras, filters=filters,
            stop_on_loops=settings.stop_on_loops, priority=self.priorities.priority(identifier),
            # a harmony reply (gpt-oss) is made of special tokens: its channels are read from them
            decode_special_tokens=getattr(tokenizer.chat_format, "harmony", False),
            **({"embeddings": embeddings} if embeddings else {}),
        )
        self._jobs[identifier] = job
        return job, ids.shape[-1]

    def _filters(self, settings: ChatSettings) -> list | None:
        """The job's constrained-decoding filters. JSON mode: the reply is one JSON object (a fresh filter per
        job: filters hold the job's state)."""
        import engine

        return [engine.JSONSchemaFilter({"type": "object"})] if settings.json_mode else None

    def job_ended(self, identifier: Any) -> None:
        self._forget_job(identifier)

    async def cancel(self, identifier: Any) -> bool:
        """Cancel a chat's reply; when this returns its pages are back with the generator.
        False if that chat has no job (yet)."""
        job = self._forget_job(identifier)
        if job is None:
            return False
        await job.cancel()
        return True

    @property
    def running(self) -> list:
        return list(self._jobs)
