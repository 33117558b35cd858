"""Constrained decoding: filters that say which tokens a job may generate next.

The generator asks a job's filters for a mask of allowed tokens before sampling (possibly on a worker thread
while the next forward pass runs) and feeds them each sampled token. The built-ins compile a choice list, a
regex, a JSON schema or a Lark grammar with llguidance, a real incremental grammar engine, so masks are exact
over any tokenization of the allowed text (not just the canonical one).
"""
from __future__ import annotations

import abc
import json
import threading
import weakref
from typing import TYPE_CHECKING, Any

import llguidance
import numpy as np
from llguidance.numpy import allocate_token_bitmask, fill_next_token_bitmask

if TYPE_CHECKING:
    from ..model.tokenizer import Tokenizer


class Filter(abc.ABC):
    """A constraint on what a job may generate; stateful, one instance per job (filters are not shared)."""

    @abc.abstractmethod
    def begin(self, tokenizer: Tokenizer) -> None:
        """Called once when the job starts; (re)sets the filter to its initial state."""

    @abc.abstractmethod
    def mask(self) -> np.ndarray | None:
        """Bool array (tokenizer.vocab_size,), True = allowed next; None = anything goes."""

    @abc.abstractmethod
    def feed(self, token: int) -> None:
        """Advance past the token that was sampled."""

    @property
    @abc.abstractmethod
    def can_end(self) -> bool:
        """The output so far is complete: EOS/stop tokens are allowed now."""

    @property
    @abc.abstractmethod
    def done(self) -> bool:
        """Nothing more may follow: the job must end now (eos_reason "end_filter")."""


# ---------------------------------------------------------------------------------------------- llguidance

# Building llguidance's token trie takes ~1 s on a 49k vocabulary: once per Tokenizer, shared by all jobs.
_LL_TOKENIZERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_LL_TOKENIZERS_LOCK = threading.Lock()


class _VocabView:
    """What llguidance.TokenizerWrapper reads: every token's bytes, special ids, and an encode callback."""

    def __init__(self, tokenizer: Tokenizer):
        self.eos_token_id = tokenizer.eos_token_id
        self.bos_token_id = tokenizer.bos_token_id
        self.tokens = [tokenizer.token_bytes(i) for i in range(tokenizer.vocab_size)]
        self.special_token_ids = sorted(tokenizer.special_token_ids)
        self._tokenizer = tokenizer

    def __call__(self, text: str) -> list[int]:
        if not isinstance(text, str):  # makes TokenizerWrapper hand us str, not bytes
            raise TypeError("text only")
        return self._tokenizer.encode(text)[0].tolist()


def llg_tokenizer(tokenizer: Tokenizer) -> llguidance.LLTokenizer:
    """The llguidance view of `tokenizer` (cached per instance; the first call costs about a second)."""
    with _LL_TOKENIZERS_LOCK:
        ll = _LL_TOKENIZERS.get(tokenizer)
        if ll is None:
            if tokenizer.eos_token_id is None:
                raise ValueError(f"{tokenizer!r} has no EOS token: filters need one to end the output")
            ll = llguidance.LLTokenizer(llguidance.TokenizerWrapper(_VocabView(tokenizer)),
                                        n_vocab=tokenizer.vocab_size, eos_token=tokenizer.eos_token_id)
            _LL_TOKENIZERS[tokenizer] = ll
        return ll


def _check_grammar(grammar: str, what: str) -> None:
    is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar)
    if is_error:
        raise ValueError(f"invalid {what}: {messages[0].strip()}")


class LLGuidanceFilter(Filter):
    """Any llguidance grammar (the JSON form, or what LLMatcher.grammar_from_* returns)."""

    def __init__(self, grammar: str, what: str = "llguidance grammar"):
        if not isinstance(grammar, str):
            raise TypeError(f"grammar must be a str, got {type(grammar).__name__}")
        _check_grammar(grammar, what)  # fail when the job is built, not when it starts
        self.grammar = grammar
        self._what = what
        self._lock = threading.Lock()
        self._tokenizer: Tokenizer | None = None
        self._matcher: llguidance.LLMatcher | None = None

    def begin(self, tokenizer: Tokenizer) -> None:
        ll = llg_tokenizer(tokenizer)
        matcher = llguidance.LLMatcher(ll, self.grammar, log_level=0)
        if matcher.is_error():
            raise ValueError(f"invalid {self._what}: {matcher.get_error().strip()}")
        with self._lock:
            self._tokenizer = tokenizer
            self._matcher = matcher
            self._bits = allocate_token_bitmask(1, ll.vocab_size)
            self._stops = np.array(sorted(tokenizer.stop_token_ids), dtype=np.int64)
            self._cached: np.ndarray | None = None  # mask of the current state; any feed clears it

    def _started(self) -> llguidance.LLMatcher:
        if self._matcher is None:
            raise RuntimeError(f"{type(self).__name__}.begin(tokenizer) must be called before use")
        return self._matcher

    def mask(self) -> np.ndarray:
        with self._lock:
            matcher = self._started()
            if self._cached is None:
                fill_next_token_bitmask(matcher, self._bits)  # drops the GIL while it works
                if matcher.is_error():
                    raise RuntimeError(f"{type(self).__name__} failed: {matcher.get_error().strip()}")
                allowed = np.unpackbits(self._bits[0].view(np.uint8), bitorder="little")
                allowed = allowed[:self._tokenizer.vocab_size].astype(bool)
                if matcher.is_accepting():  # llguidance allows only its EOS; any stop token ends the job
                    allowed[self._stops] = True
                allowed.flags.writeable = False  # shared with the caller: a cache, not a scratchpad
                self._cached = allowed
            return self._cached

    def feed(self, token: int) -> None:
        with self._lock:
            matcher = self._started()
            if not 0 <= token < self._tokenizer.vocab_size:
                raise ValueError(f"token {token} is outside the vocabulary [0, {self._tokenizer.vocab_size})")
            if token in self._tokenizer.stop_token_ids and matcher.is_accepting():
                token = self._tokenizer.eos_token_id  # any stop token is EOS to the grammar
            if not matcher.consume_token(int(token)):
                piece = self._tokenizer.token_bytes(token)
                raise ValueError(f"token {token} ({piece!r}) is not allowed by {type(self).__name__} "
                                 f"(the filter is now unusable): {matcher.get_error().strip()}")
            self._cached = None

    # Before begin() both are False (not raising, so duck-typing checks like hasattr() hold).
    @property
    def can_end(self) -> bool:
        with self._lock:
            return self._matcher is not None and self._matcher.is_accepting()

    @property
    def done(self) -> bool:
        with self._lock:
            return self._matcher is not None and self._matcher.is_stopped()


class ChoiceFilter(LLGuidanceFilter):
    """The output is exactly one of `choices`."""

    def __init__(self, choices: list[str]):
        if isinstance(choices, str) or not isinstance(choices, (list, tuple)) or not choices:
            raise ValueError(f"choices must be a non-empty list of strings, got {choices!r}")
        if not all(isinstance(c, str) for c in choices):
            raise ValueError(f"choices must all be strings, got {choices!r}")
        self.choices = list(choices)
        # Lark string literals take JSON escapes, so json.dumps quotes any text safely.
        lark = "start: " + " | ".join(json.dumps(c, ensure_ascii=False) for c in dict.fromkeys(choices))
        super().__init__(llguidance.LLMatcher.grammar_from_lark(lark), "choice list")


class RegexFilter(LLGuidanceFilter):
    """The output matches `pattern` in full (Rust regex syntax, close to Python's re)."""

    def __init__(self, pattern: str):
        if not isinstance(pattern, str):
            raise TypeError(f"pattern must be a str, got {type(pattern).__name__}")
        self.pattern = pattern
        super().__init__(llguidance.LLMatcher.grammar_from_regex(pattern), f"regex {pattern!r}")


class JSONSchemaFilter(LLGuidanceFilter):
    """The output is one JSON value valid under `schema`.

    Whitespace is fixed (", " and ": ", no newlines) unless whitespace_flexible: small models given
    free whitespace under greedy decoding tend to loop on newlines instead of closing the object.
    """

    def __init__(self, schema: dict | str, whitespace_flexible: bool = False):
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except json.JSONDecodeError as e:
                raise ValueError(f"JSON schema is not valid JSON: {e}") from None
        if not isinstance(schema, (dict, bool)):
            raise ValueError(f"a JSON schema is an object (dict), got {type(schema).__name__}")
        self.schema = schema
        options: dict[str, Any] = {"whitespace_flexible": whitespace_flexible}
        if not whitespace_flexible:
            options.update(item_separator=", ", key_separator=": ")
        try:
            grammar = llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=options)
        except ValueError as e:
            raise ValueError(f"invalid JSON schema: {e}") from None
        super().__init__(grammar, "JSON schema")


class GrammarFilter(LLGuidanceFilter):
    """The output is a sentence of a Lark grammar (llguidance's dialect, start rule `start`)."""

    def __init__(self, lark_grammar: str):
        if not isinstance(lark_grammar, str):
            raise TypeError(f"lark_grammar must be a str, got {type(lark_grammar).__name__}")
        self.lark_grammar = lark_grammar
        super().__init__(llguidance.LLMatcher.grammar_from_lark(lark_grammar), "Lark grammar")
