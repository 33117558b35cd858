"""DynamicJob: one generation request, its sequence in the page table, and the results it reports."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from .pagetable import CachePage
from .sampling import JobSampler, SamplerSettings
from .speculative import NgramIndex
from .streaming import TextStream

if TYPE_CHECKING:
    from .generator import DynamicGenerator


def _not_yet(name: str) -> NotImplementedError:
    return NotImplementedError(f"{name} is not implemented yet (advanced generation, issue 4); "
                               f"leave it at its default")


@dataclass(eq=False)
class Sequence:
    """One row of the batch: its tokens (prompt + generated) and the pages holding their K/V."""

    tokens: list[int]
    prompt_len: int
    pages: list[CachePage] = field(default_factory=list)
    kv_len: int = 0  # tokens whose K/V is in the cache


class DynamicJob:
    """A request: the prompt, how to sample, when to stop, and what to report (ExLlamaV2's parameters)."""

    def __init__(
        self,
        input_ids: torch.Tensor,
        max_new_tokens: int,
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
        embeddings: list | None = None,
    ):
        if isinstance(input_ids, (list, tuple)):
            raise _not_yet("a list of input_ids (CFG prompt pairs)")
        if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2 or input_ids.shape[0] != 1:
            raise ValueError("input_ids must be a LongTensor of shape (1, n), as Tokenizer.encode returns")
        if input_ids.shape[1] == 0:
            raise ValueError("input_ids is empty: the prompt needs at least one token")
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens <= 0:
            raise ValueError(f"max_new_tokens must be a positive int, got {max_new_tokens!r}")
        if not isinstance(min_new_tokens, int) or min_new_tokens < 0:
            raise ValueError(f"min_new_tokens must be an int >= 0, got {min_new_tokens!r}")
        if max_skips < 0:
            raise ValueError(f"max_skips must be >= 0, got {max_skips}")
        if return_top_tokens < 0:
            raise ValueError(f"return_top_tokens must be >= 0, got {return_top_tokens}")
        for name, value in (("banned_strings", banned_strings), ("token_healing", token_healing),
                            ("filters", filters), ("filter_prefer_eos", filter_prefer_eos),
                            ("embeddings", embeddings)):
            if value:
                raise _not_yet(name)
        self.gen_settings = gen_settings if gen_settings is not None else SamplerSettings()
        self.gen_settings.validate()
        if self.gen_settings.cfg_scale is not None:
            raise _not_yet("cfg_scale (classifier-free guidance)")
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
        self.input_ids = input_ids
        self.max_new_tokens = max_new_tokens
        self.min_new_tokens = min_new_tokens
        self.max_skips = max_skips
        self.seed = seed
        self.decode_special_tokens = decode_special_tokens
        self.return_top_tokens = return_top_tokens
        self.return_logits = return_logits
        self.return_probs = return_probs
        self.identifier = identifier

        self.serial: int | None = None
        self.generator: DynamicGenerator | None = None
        self.skips = 0
        self.seq = Sequence(tokens=input_ids[0].tolist(), prompt_len=input_ids.shape[1])
        self.sampler: JobSampler | None = None
        self.stream: TextStream | None = None
        self.new_tokens = 0
        self.completion = ""
        self.cached_tokens = 0
        self.cached_pages = 0
        self.prefill_done = 0  # prompt tokens whose K/V is in the cache (ours or reused)
        self.accepted_draft_tokens = 0
        self.rejected_draft_tokens = 0
        self.ngram: NgramIndex | None = None
        self.draft_kv_len = 0  # tokens whose K/V the draft model's cache holds
        self.time_enqueue = self.time_start = self.time_first_token = 0.0

    # ---- lifecycle, driven by the generator -------------------------------------------------------
    @property
    def prompt_len(self) -> int:
        return self.seq.prompt_len

    @property
    def total_len(self) -> int:
        return self.prompt_len + self.max_new_tokens

    @property
    def prefilling(self) -> bool:
        """Still feeding prompt tokens before the last one (which is fed by the decode step)."""
        return self.seq.kv_len < self.prompt_len - 1

    def start(self, generator: "DynamicGenerator", alloc) -> dict:
        self.seq.pages = alloc.pages
        self.seq.kv_len = alloc.cached_tokens
        self.cached_tokens = alloc.cached_tokens
        self.cached_pages = alloc.cached_pages
        tok = generator.tokenizer
        stops = set(self.stop_tokens)
        self.sampler = JobSampler(self.gen_settings, self.seed, tok.vocab_size, stop_token_ids=stops, tokenizer=tok)
        self.stream = TextStream(tok, self.stop_strings, self.decode_special_tokens)
        self.ngram = NgramIndex(generator.max_ngram) if generator.use_ngram_draft else None
        self.draft_kv_len = alloc.cached_tokens
        self.time_start = time.perf_counter()
        return self._result("started")

    def prefill_result(self) -> dict:
        return self._result("prefill", curr_progress=self.seq.kv_len, max_progress=self.prompt_len)

    def blocked_tokens(self, offset: int = 0) -> list[int] | None:
        """Stop tokens can't end the job before min_new_tokens (offset: tokens drawn earlier this step)."""
        if self.new_tokens + offset < self.min_new_tokens and self.stop_tokens:
            return sorted(self.stop_tokens)
        return None

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
            if merged["eos"]:
                break
        return merged

    def _accept_token(self, token: int, sample, logits: torch.Tensor | None) -> dict:
        """Add one sampled token; returns its streaming result (with eos fields if the job ended)."""
        if self.new_tokens == 0:
            self.time_first_token = time.perf_counter()
        self.seq.tokens.append(token)
        self.new_tokens += 1
        extra: dict[str, Any] = {"token_ids": [token]}
        if self.return_probs:
            extra["token_probs"] = [sample.prob]
        if self.return_top_tokens:
            extra["top_k_tokens"] = [sample.top_tokens]
            extra["top_k_probs"] = [sample.top_probs]
        if self.return_logits and logits is not None:
            extra["logits"] = logits[: self.generator.tokenizer.vocab_size].unsqueeze(0).clone()
        if token in self.stop_tokens:
            held = self.stream.flush() if self.stream is not None else ""
            return self._finish("stop_token", held_text=held, eos_triggering_token_id=token,
                                eos_triggering_token_str=self.generator.tokenizer.decode([token], True), **extra)
        chunk = self.stream.feed([token])
        self.completion += chunk.text
        if chunk.stop_string is not None:
            return self._finish("stop_string", text=chunk.text, held_text=chunk.held,
                                eos_triggering_string=chunk.stop_string, **extra)
        if self.new_tokens >= self.max_new_tokens:
            tail = self.stream.flush()
            self.completion += tail
            return self._finish("max_new_tokens", text=chunk.text + tail, **extra)
        return self._result("streaming", text=chunk.text, eos=False, **extra)

    def _finish(self, reason: str, text: str = "", held_text: str = "", **extra: Any) -> dict:
        now = time.perf_counter()
        first = self.time_first_token or now
        return self._result(
            "streaming", text=text, eos=True, eos_reason=reason,
            full_completion=self.completion, new_tokens=self.new_tokens, prompt_tokens=self.prompt_len,
            time_enqueued=self.time_start - self.time_enqueue, time_prefill=first - self.time_start,
            time_generate=now - first, cached_pages=self.cached_pages, cached_tokens=self.cached_tokens,
            accepted_draft_tokens=self.accepted_draft_tokens, rejected_draft_tokens=self.rejected_draft_tokens,
            held={"text": held_text}, **extra)

    def _result(self, stage: str, **fields: Any) -> dict:
        return {"job": self, "stage": stage, "identifier": self.identifier, "serial": self.serial, **fields}

    def __repr__(self) -> str:
        return f"DynamicJob(serial={self.serial}, prompt={self.prompt_len}, new={self.new_tokens}/{self.max_new_tokens})"
