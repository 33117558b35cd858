"""DynamicJob: one generation request, its sequence in the page table, and the results it reports."""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..contract import EosReason, SamplerSettings, Stage
from ..sampling.sampler import JobSampler
from .adapters import lora_request
from .banned import BannedStrings
from .embeddings import FIRST_ID, EmbeddingLookup
from .filters import Filter
from .loops import LoopGuard
from .sequence import Sequence
from .ngram import NgramIndex
from .streaming import StreamChunk, TextStream


@dataclass(frozen=True)
class JobContext:
    """What a job needs from the generator that runs it: given at enqueue, instead of the generator."""

    tokenizer: Any
    vocab_size: int  # ids the sampler may draw: min(model, tokenizer)
    max_ngram: int | None = None  # n-gram drafting's longest n-gram; None: no n-gram drafting
    max_seq_len: int | None = None  # the context: a job without max_new_tokens generates until it is full


class DynamicJob:
    """A request: the prompt, how to sample, when to stop, and what to report (ExLlamaV2's parameters, plus
    stop_on_loops: end a reply stuck repeating itself, eos_reason "repetition"; see loops.LoopGuard).

    embeddings: MMEmbedding objects (engine.generator.embeddings) whose placeholder token_ids the prompt
    holds; the model reads their vectors at those positions (images). Such a job is never drafted by a
    draft model (it cannot see the images); n-gram drafting still runs, never proposing a placeholder.

    max_new_tokens=None generates until the context (the generator's max_seq_len) is full: pages are taken as
    the reply grows, so a long limit costs nothing until it is used. priority orders jobs when the cache runs
    out of pages and which queued job starts first (vLLM's convention: lower runs first); among equals, the job
    enqueued last gives its pages back first and resumes, exactly where it was, once pages free up.
    DynamicGenerator.set_priority re-ranks a queued or running job."""

    def __init__(
        self,
        input_ids: torch.Tensor,
        max_new_tokens: int | None = None,
        min_new_tokens: int = 0,
        max_skips: int = 4,
        gen_settings: SamplerSettings | None = None,
        seed: int | None = None,
        stop_conditions: list[int | str] | tuple | set | None = None,
        decode_special_tokens: bool = False,
        return_top_tokens: int = 0,
        return_logits: bool = False,
        return_probs: bool = False,
        identifier: Any = None,
        banned_strings: list[str] | None = None,
        token_healing: bool = False,
        filters: list | None = None,
        filter_prefer_eos: bool = False,
        loras: list | None = None,
        stop_on_loops: bool = False,
        embeddings: list | None = None,
        priority: int = 0,
    ):
        prompts = list(input_ids) if isinstance(input_ids, (list, tuple)) else [input_ids]
        if len(prompts) not in (1, 2):
            raise ValueError("input_ids is one (1, n) tensor, or a (positive, negative) pair for CFG")
        for ids in prompts:
            if not isinstance(ids, torch.Tensor) or ids.dim() != 2 or ids.shape[0] != 1:
                raise ValueError("input_ids must be a LongTensor of shape (1, n), as Tokenizer.encode returns")
            if ids.shape[1] == 0:
                raise ValueError("input_ids is empty: the prompt needs at least one token")
        if max_new_tokens is not None and (isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int)
                                           or max_new_tokens <= 0):
            raise ValueError(f"max_new_tokens must be a positive int or None (until the context is full), got "
                             f"{max_new_tokens!r}")
        if isinstance(priority, bool) or not isinstance(priority, int):
            raise ValueError(f"priority must be an int, got {priority!r}")
        if not isinstance(min_new_tokens, int) or min_new_tokens < 0:
            raise ValueError(f"min_new_tokens must be an int >= 0, got {min_new_tokens!r}")
        if max_skips < 0:
            raise ValueError(f"max_skips must be >= 0, got {max_skips}")
        if return_top_tokens < 0:
            raise ValueError(f"return_top_tokens must be >= 0, got {return_top_tokens}")
        filters = list(filters or [])
        for f in filters:
            if not isinstance(f, Filter):
                raise TypeError(f"filters must be engine.Filter objects, got {type(f).__name__}")
        if filters and banned_strings:
            raise ValueError("banned_strings cannot be combined with filters")
        if filter_prefer_eos and not filters:
            raise ValueError("filter_prefer_eos needs filters")
        self.lora_request = lora_request(loras)
        # images and other embedding inputs: the vectors behind the prompt's placeholder ids (>= 1e9)
        self.embeddings = EmbeddingLookup(list(embeddings or []))
        for ids in prompts:
            stray = [t for t in ids[0].tolist() if t >= FIRST_ID and not self.embeddings.covers(t)]
            if stray:
                raise ValueError(f"input_ids hold placeholder ids no embedding of this job covers: {stray[:3]} "
                                 "(pass the MMEmbedding objects whose token_ids the prompt uses as embeddings=)")
        self.gen_settings = gen_settings if gen_settings is not None else SamplerSettings()
        self.gen_settings.validate()
        self.cfg = len(prompts) == 2
        if self.cfg != (self.gen_settings.cfg_scale is not None):
            raise ValueError("CFG needs both a (positive, negative) input_ids pair and gen_settings.cfg_scale")
        if self.cfg and (filters or token_healing):
            raise ValueError("CFG cannot be combined with filters or token healing")
        self.stop_tokens: set[int] = set()
        self.stop_strings: list[str] = []
        for cond in stop_conditions or ():
            if isinstance(cond, bool) or not isinstance(cond, (int, str)):
                raise ValueError(f"stop_conditions take token ids (int) and strings, got {cond!r}")
            if isinstance(cond, str):
                if not cond:
                    raise ValueError("an empty stop string would stop at once")
                self.stop_strings.append(cond)
            else:
                self.stop_tokens.add(cond)
        self.input_ids = prompts[0]
        self.max_new_tokens = max_new_tokens  # None until bind: the room the context leaves
        self.priority = priority
        self.min_new_tokens = min_new_tokens
        self.max_skips = max_skips
        self.seed = seed
        self.decode_special_tokens = decode_special_tokens
        self.return_top_tokens = return_top_tokens
        self.return_logits = return_logits
        self.return_probs = return_probs
        self.identifier = identifier
        if banned_strings is not None and (isinstance(banned_strings, str) or not all(
                isinstance(b, str) and b for b in banned_strings)):
            raise ValueError("banned_strings must be a list of non-empty strings")
        self.banned_strings = list(banned_strings or [])
        self.filters = filters
        self.filter_prefer_eos = filter_prefer_eos
        self.loops = LoopGuard() if stop_on_loops else None  # ends a reply stuck repeating ("repetition")
        self.filter_mask: np.ndarray | None = None  # allowed next tokens, evaluated by the generator
        self.token_healing = token_healing
        self.banned: BannedStrings | None = None
        self.heal_allowed: np.ndarray | None = None  # first-token candidates after token healing (bool mask)
        self.heal_prefix = ""  # text of the removed prompt token, not streamed again

        self.serial: int | None = None
        self.context: JobContext | None = None
        self.loras: tuple = ()  # ((LoRA, scale), ...) this job runs, fixed at enqueue (bind)
        self.lora_root: bytes | None = None  # the page-hash root of that set
        self.skips = 0
        self.seqs = [Sequence(tokens=ids[0].tolist(), prompt_len=ids.shape[1]) for ids in prompts]
        self.seq = self.seqs[0]  # the sequence whose tokens are the output (CFG: the positive prompt)
        self.sampler: JobSampler | None = None
        self.stream: TextStream | None = None
        self.new_tokens = 0
        self.completion = ""
        self.cached_tokens = 0
        self.cached_pages = 0
        self.accepted_draft_tokens = 0
        self.rejected_draft_tokens = 0
        self.ngram: NgramIndex | None = None
        self.time_enqueue = self.time_start = self.time_first_token = 0.0
        self.preemptions = 0  # times the job gave its pages back for others and waited to resume
        self.resumes = 0  # times it was admitted again after a preemption
        self.recomputed_tokens = 0  # K/V tokens it lost to preemption (evicted while it waited) and refed
        self.preempted_kv: list[int] | None = None  # per sequence, tokens of K/V held when last preempted
        # its pages that stayed in the prompt cache when last preempted (CachedPage, for the page map)
        self.preempted_pages: list = []

    # ---- lifecycle, driven by the generator -------------------------------------------------------
    @property
    def prompt_len(self) -> int:
        return self.seq.prompt_len

    @property
    def total_len(self) -> int:
        """The longest sequence this job can grow to (each CFG sequence gets its own pages); known once bound
        when max_new_tokens is None."""
        return max(s.prompt_len for s in self.seqs) + self.max_new_tokens

    @property
    def prefilling(self) -> bool:
        """Still feeding prompt tokens (or, resumed after a preemption, lost K/V) before the last one, which
        the decode step feeds."""
        return any(s.kv_len < s.fill_len - 1 for s in self.seqs)

    @property
    def started(self) -> bool:
        """Admitted once (its sampler, stream and filters exist): a pending started job was preempted."""
        return self.sampler is not None

    def bind(self, context: JobContext, serial: int, loras: tuple = (), lora_root: bytes | None = None) -> None:
        """Join a generator's queue with the adapters it resolved for this job (their set roots the job's
        page hashes); token healing trims the prompt here, before pages are reserved."""
        self.serial = serial
        self.context = context
        self.loras = tuple(loras)
        self.lora_root = lora_root
        self.time_enqueue = time.perf_counter()
        if self.token_healing and self.prompt_len > 1 and self.seq.tokens[self.prompt_len - 1] < FIRST_ID:
            pieces = context.tokenizer.pieces
            last = self.seq.pop_prompt_token()
            self.heal_prefix = pieces[last]
            self.heal_allowed = np.array([p.startswith(self.heal_prefix) for p in pieces[: context.vocab_size]])
        if self.max_new_tokens is None:
            if context.max_seq_len is None:
                raise ValueError("max_new_tokens=None needs a generator that knows its context (max_seq_len)")
            self.max_new_tokens = context.max_seq_len - max(s.prompt_len for s in self.seqs)

    def start(self, allocs: list) -> dict:
        for seq, alloc in zip(self.seqs, allocs):
            seq.attach(alloc.pages, alloc.cached_tokens, alloc.draft_tokens)
        self.cached_tokens = sum(a.cached_tokens for a in allocs)
        self.cached_pages = sum(a.cached_pages for a in allocs)
        ctx = self.context
        tok = ctx.tokenizer
        stops = set(self.stop_tokens)
        self.sampler = JobSampler(self.gen_settings, self.seed, ctx.vocab_size, stop_token_ids=stops, tokenizer=tok)
        self.stream = TextStream(tok, self.stop_strings, self.decode_special_tokens)
        self.ngram = NgramIndex(ctx.max_ngram) if ctx.max_ngram is not None else None
        if self.banned_strings:
            self.banned = BannedStrings(tok, self.banned_strings, self.decode_special_tokens)
        for f in self.filters:
            f.begin(tok)
        if self.filters:  # a finished grammar ends the job on any of the model's stop tokens
            self.stop_tokens |= set(tok.stop_token_ids)
        self.time_start = time.perf_counter()
        return self._result("started", cached_tokens=self.cached_tokens, cached_pages=self.cached_pages,
                            prompt_tokens=self.prompt_len, loras=self.lora_names())

    def resume(self, allocs: list) -> None:
        """Take pages again after a preemption. Everything else (sampler and its random state, text stream,
        filters, banned-string holds, n-gram index) stayed with the job, so its output goes on exactly."""
        for seq, alloc in zip(self.seqs, allocs):
            seq.resume(alloc.pages, alloc.cached_tokens, alloc.draft_tokens)

    def lora_names(self) -> list[tuple[str, float]]:
        """(name, scale) of each adapter this job runs, as results report them."""
        return [(lora.name, scale) for lora, scale in self.loras]

    def prefill_result(self) -> dict:
        return self._result("prefill", curr_progress=sum(s.kv_len for s in self.seqs),
                            max_progress=sum(s.prompt_len for s in self.seqs))

    def capacity(self, seq: Sequence) -> int:
        """How long one of the job's sequences can grow (the tokens its pages must hold): its prompt plus
        max_new_tokens."""
        return seq.prompt_len + self.max_new_tokens

    def stable_len(self, seq: Sequence) -> int:
        """Tokens of seq that can no longer be rewound (all but those held for a possible banned string)."""
        return len(seq.tokens) - (len(self.banned.held) if self.banned is not None else 0)

    def compute_filter_mask(self) -> None:
        """Allowed next tokens under every filter; the generator may run this while the forward pass runs."""
        mask = None
        for f in self.filters:
            m = f.mask()
            if m is not None:
                m = np.asarray(m, dtype=bool)[: self.context.vocab_size]
                mask = m if mask is None else mask & m
        self.filter_mask = mask

    def blocked_tokens(self, offset: int = 0) -> np.ndarray | None:
        """Tokens the sampler may not draw next (offset: tokens drawn earlier this step).

        Stop tokens before min_new_tokens or while a filter's output is incomplete, tokens that began a
        banned string here, tokens a filter disallows, and after token healing, first tokens that don't
        extend the removed prompt token's text.
        """
        n = self.new_tokens + offset
        blocked: set[int] = set()
        if n < self.min_new_tokens or (self.filters and not all(f.can_end for f in self.filters)):
            blocked |= self.stop_tokens
        if self.banned is not None:
            blocked |= self.banned.blocked_at(len(self.seq.tokens) + offset)
        allowed = self.heal_allowed if n == 0 else None
        if self.filters and self.filter_mask is not None:
            allowed = self.filter_mask if allowed is None else allowed & self.filter_mask
        if self.filter_prefer_eos and all(f.can_end for f in self.filters):
            eos_first = sorted(self.stop_tokens, key=lambda t: t != self.context.tokenizer.eos_token_id)
            eos = [t for t in eos_first if allowed is None or (t < len(allowed) and allowed[t])]
            if eos:
                allowed = np.zeros(self.context.vocab_size, dtype=bool)
                allowed[eos[0]] = True
        out = np.flatnonzero(~allowed) if allowed is not None else np.empty(0, dtype=np.int64)
        if blocked:
            out = np.union1d(out, np.fromiter(blocked, dtype=np.int64))
        return out if out.size else None

    def accept_tokens(self, samples: list, logits: list[torch.Tensor] | None) -> dict:
        """Add this step's sampled tokens (several when drafts were accepted); one merged streaming result."""
        merged: dict | None = None
        for i, sample in enumerate(samples):
            r = self._accept_token(sample.token, sample, logits[i] if logits is not None else None)
            if merged is None:
                merged = r
            else:
                merged["text"] += r.pop("text")
                for key in ("token_ids", "token_probs", "top_k_tokens", "top_k_probs"):
                    if key in r:
                        merged[key] += r.pop(key)
                if "logits" in r:
                    merged["logits"] = torch.cat([merged["logits"], r.pop("logits")])
                merged.update(r)
            if merged["eos"] or "suppressed_tokens" in r:
                break  # later drafts followed text that was just rewound
        return merged

    def _accept_token(self, token: int, sample, logits: torch.Tensor | None) -> dict:
        """Add one sampled token; returns its streaming result (with eos fields if the job ended)."""
        if self.new_tokens == 0:
            self.time_first_token = time.perf_counter()
        for seq in self.seqs:
            seq.append(token)
        self.new_tokens += 1
        extra: dict[str, Any] = {"token_ids": [token]}
        if self.return_probs:
            extra["token_probs"] = [sample.prob]
        if self.return_top_tokens:
            extra["top_k_tokens"] = [sample.top_tokens]
            extra["top_k_probs"] = [sample.top_probs]
        if self.return_logits and logits is not None:
            extra["logits"] = logits[: self.context.vocab_size].unsqueeze(0).clone()
        if token in self.stop_tokens:
            held = self._stream(self.banned.flush()).text if self.banned is not None else ""
            held += self.stream.flush()
            return self._finish("stop_token", held_text=held, eos_triggering_token_id=token,
                                eos_triggering_token_str=self.context.tokenizer.decode([token], True), **extra)
        for f in self.filters:
            f.feed(token)
        release = [token]
        if self.banned is not None:
            release, rewind = self.banned.feed(token, len(self.seq.tokens) - 1)
            if rewind is not None:
                for seq in self.seqs:
                    seq.rewind(len(rewind.suppressed_tokens))
                self.new_tokens -= len(rewind.suppressed_tokens)
                if self.ngram is not None:
                    self.ngram = NgramIndex(self.ngram.max_ngram)
                return self._result("streaming", text="", eos=False, suppressed_tokens=rewind.suppressed_tokens,
                                    suppressed_text=rewind.suppressed_text, **extra)
            if self.new_tokens >= self.max_new_tokens:
                release += self.banned.flush()
        chunk = self._stream(release)
        self.completion += chunk.text
        if chunk.stop_string is not None:
            return self._finish("stop_string", text=chunk.text, held_text=chunk.held,
                                eos_triggering_string=chunk.stop_string, **extra)
        if any(f.done for f in self.filters):
            tail = self.stream.flush()
            self.completion += tail
            return self._finish("end_filter", text=chunk.text + tail, **extra)
        if self.loops is not None and self.loops.feed(release, chunk.text):
            tail = self.stream.flush()
            self.completion += tail
            return self._finish("repetition", text=chunk.text + tail, **extra)
        if self.new_tokens >= self.max_new_tokens:
            tail = self.stream.flush()
            self.completion += tail
            return self._finish("max_new_tokens", text=chunk.text + tail, **extra)
        return self._result("streaming", text=chunk.text, eos=False, **extra)

    def _stream(self, tokens: list[int]):
        """Feed tokens to the text stream, dropping the healed prompt text from the front once."""
        chunk = self.stream.feed(tokens) if tokens else StreamChunk("")
        if self.heal_prefix and chunk.text:
            cut = min(len(self.heal_prefix), len(chunk.text))
            if chunk.text.startswith(self.heal_prefix[:cut]):
                chunk.text = chunk.text[cut:]
                self.heal_prefix = self.heal_prefix[cut:]
            else:
                self.heal_prefix = ""
        return chunk

    def _finish(self, reason: EosReason, text: str = "", held_text: str = "", **extra: Any) -> dict:
        now = time.perf_counter()
        first = self.time_first_token or now
        return self._result(
            "streaming", text=text, eos=True, eos_reason=reason,
            full_completion=self.completion, new_tokens=self.new_tokens, prompt_tokens=self.prompt_len,
            time_enqueued=self.time_start - self.time_enqueue, time_prefill=first - self.time_start,
            time_generate=now - first, cached_pages=self.cached_pages, cached_tokens=self.cached_tokens,
            accepted_draft_tokens=self.accepted_draft_tokens, rejected_draft_tokens=self.rejected_draft_tokens,
            held={"text": held_text}, loras=self.lora_names(), **extra)

    def _result(self, stage: Stage, **fields: Any) -> dict:
        return {"job": self, "stage": stage, "identifier": self.identifier, "serial": self.serial, **fields}

    def __repr__(self) -> str:
        return f"DynamicJob(serial={self.serial}, prompt={self.prompt_len}, new={self.new_tokens}/{self.max_new_tokens})"
