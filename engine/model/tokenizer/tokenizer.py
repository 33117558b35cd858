"""Tokenizer: the `tokenizers` library behind an ExLlamaV2-like API, plus the model's chat template.

Sources: an HF folder (tokenizer.json), or a GGUF's vocabulary (rebuilt by engine.model.tokenizer.gguf_vocab as
byte-level BPE or SentencePiece).
"""

from __future__ import annotations

import json
import re
import threading
from datetime import datetime
from functools import cached_property, partial
from pathlib import Path
from typing import Any, Iterable

import torch
from tokenizers import Tokenizer as HFTokenizer

# Names of end-of-turn tokens that stop generation when the vocabulary has them.
END_OF_TURN_TOKENS = ("<|im_end|>", "<|eot_id|>", "<|endoftext|>", "<|end_of_text|>", "<|end|>",
                      "<end_of_turn>", "</s>")

from ...chat.content_parts import as_parts, takes_content_parts
from ...chat.harmony import END as HARMONY_END, STOP_TOKENS as HARMONY_STOPS, harmony_vocabulary
from ..heap import release_freed_memory
from .plain_twin import plain_twin
from ..chat_format import AUTO, CHATML_TEMPLATE, ChatFormat, decide  # noqa: F401 (CHATML_TEMPLATE: its old home)

def _byte_alphabet() -> dict[int, str]:
    """GPT-2's printable stand-in character for each byte (byte-level BPE's alphabet)."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), 256))
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


_BYTE_OF_CHAR = {c: b for b, c in _byte_alphabet().items()}
_BYTE_FALLBACK = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")


class Tokenizer:
    """Text <-> token ids, special tokens, stop tokens and chat formatting for one model."""

    def __init__(self, tokenizer: HFTokenizer, *, bos_token: str | None = None, eos_token: str | None = None,
                 chat_template: str | None = None, add_bos: bool = False, eos_token_ids: Iterable[int] = (),
                 source: str = "", arch: str | None = None):
        self._tok = tokenizer
        self._plain: HFTokenizer | None = None  # _tok_plain's instance, built on first use
        self._plain_lock = threading.Lock()
        self.source = source
        self.add_bos = add_bos
        self.vocab_size: int = tokenizer.get_vocab_size(with_added_tokens=True)
        self.bos_token = bos_token
        self.eos_token = eos_token
        self.bos_token_id = tokenizer.token_to_id(bos_token) if bos_token else None
        self.eos_token_id = tokenizer.token_to_id(eos_token) if eos_token else None
        stops = {i for i in eos_token_ids if i is not None}
        if self.eos_token_id is not None:
            stops.add(self.eos_token_id)
        stops.update(i for t in END_OF_TURN_TOKENS if (i := tokenizer.token_to_id(t)) is not None)
        if harmony_vocabulary(lambda t: tokenizer.token_to_id(t) is not None):
            # harmony: <|end|> only ends a message (thinking, then the answer); <|return|> and <|call|> end a reply
            stops.discard(tokenizer.token_to_id(HARMONY_END))
            stops.update(tokenizer.token_to_id(t) for t in HARMONY_STOPS if tokenizer.token_to_id(t) is not None)
        self.stop_token_ids: set[int] = stops
        self._chat_template = chat_template
        self._template = None
        self.arch = arch  # the model's architecture: picks the fallback chat format where the vocabulary is ambiguous
        self._format_choice = AUTO
        self._format: ChatFormat | None = None
        self._byte_level = _is_byte_level(tokenizer)
        self.special_token_ids: set[int] = {
            i for i, t in tokenizer.get_added_tokens_decoder().items() if t.special}

    # ------------------------------------------------------------------ loading
    @classmethod
    def load(cls, path: str | Path | None = None) -> Tokenizer:
        """From an HF folder, a .gguf file, or (None) the embedded default model."""
        if path is None:
            from engine.model.weights import default_model_path

            path = default_model_path()
        path = Path(path)
        if not path.exists():
            raise FileNotFoundError(f"Tokenizer path does not exist: {path}")
        from engine.contract import is_gguf

        if not path.is_dir() and not is_gguf(path):
            raise ValueError(f"{path} is neither a Hugging Face model folder nor a .gguf file")
        tok = cls._from_hf(path) if path.is_dir() else cls._from_gguf(path)
        # the build's temporaries (a GGUF's token and merge lists: ~45 MB for a 152k-token vocabulary) are freed
        # by now, and glibc would keep ~20 MB of them resident for good
        release_freed_memory()
        return tok

    @classmethod
    def _from_hf(cls, folder: Path) -> Tokenizer:
        tj = folder / "tokenizer.json"
        if not tj.is_file():
            raise FileNotFoundError(f"{folder} has no tokenizer.json (only fast tokenizers are supported)")
        try:
            tok = HFTokenizer.from_file(str(tj))
        except Exception as e:  # tokenizers raises a bare Exception on bad JSON
            raise ValueError(f"Cannot read {tj}: {e}") from None
        tcfg = _read_json(folder / "tokenizer_config.json")
        template = tcfg.get("chat_template")
        if (folder / "chat_template.jinja").is_file():
            template = (folder / "chat_template.jinja").read_text()
        elif (folder / "chat_template.json").is_file():
            template = _read_json(folder / "chat_template.json").get("chat_template")
        if isinstance(template, list):  # named templates: the "default" one is for chat
            named = {t.get("name"): t.get("template") for t in template}
            template = named.get("default") or next(iter(named.values()), None)
        eos_ids: list[int] = []
        for name in ("generation_config.json", "config.json"):
            eos = _read_json(folder / name).get("eos_token_id")
            eos_ids += eos if isinstance(eos, list) else [eos] if eos is not None else []
        return cls(tok, bos_token=_token_text(tcfg.get("bos_token")), eos_token=_token_text(tcfg.get("eos_token")),
                   chat_template=template, add_bos=bool(tcfg.get("add_bos_token", False)),
                   eos_token_ids=eos_ids, source=str(folder), arch=_read_json(folder / "config.json").get("model_type"))

    @classmethod
    def _from_gguf(cls, path: Path) -> Tokenizer:
        from engine.model.tokenizer import gguf_vocab
        from engine.model.gguf.file import GGUFFile

        gf = GGUFFile(path)
        meta = gf.metadata
        tok = gguf_vocab.from_gguf(meta, str(path),
                                   cache_key=gf.version_key() if gguf_vocab.recovers_merges(meta) else None)
        tokens = meta["tokenizer.ggml.tokens"]

        def text(key: str) -> str | None:
            i = meta.get(f"tokenizer.ggml.{key}")
            return tokens[i] if i is not None and 0 <= i < len(tokens) else None

        return cls(tok, bos_token=text("bos_token_id"), eos_token=text("eos_token_id"),
                   chat_template=meta.get("tokenizer.chat_template"), add_bos=gguf_vocab.default_add_bos(meta),
                   eos_token_ids=[meta["tokenizer.ggml.eot_token_id"]] if "tokenizer.ggml.eot_token_id" in meta else (),
                   source=str(path), arch=meta.get("general.architecture"))

    def save(self, folder: str | Path) -> None:
        """Write tokenizer.json + tokenizer_config.json (readable by Tokenizer.load and transformers)."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        self._tok.save(str(folder / "tokenizer.json"))
        cfg = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": self.bos_token,
               "eos_token": self.eos_token, "add_bos_token": self.add_bos, "clean_up_tokenization_spaces": False}
        if self.chat_template is not None:
            cfg["chat_template"] = self.chat_template
        (folder / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2, ensure_ascii=False))

    # ------------------------------------------------------------------ encode / decode
    @property
    def _tok_plain(self) -> HFTokenizer:
        """A second instance that treats special-token text as plain text (tokenizers' flag is per instance,
        and flipping it on a shared one would race between threads), sharing this one's model
        (engine.model.tokenizer.plain_twin). Built on first use: chats, whose templates mean their special
        tokens, never need it."""
        with self._plain_lock:
            if self._plain is None:
                self._plain = plain_twin(self._tok)
            return self._plain

    def encode(self, text: str, add_bos: bool = False, encode_special_tokens: bool = False) -> torch.Tensor:
        """(1, n) int64 ids. Special-token text in `text` stays plain text unless encode_special_tokens."""
        if not isinstance(text, str):
            raise TypeError(f"encode() takes a str, got {type(text).__name__}")
        tok = self._tok if encode_special_tokens else self._tok_plain
        ids = tok.encode(text, add_special_tokens=False).ids
        if add_bos:
            if self.bos_token_id is None:
                raise ValueError("add_bos=True but this tokenizer has no BOS token")
            ids = [self.bos_token_id] + ids
        return torch.tensor([ids], dtype=torch.long)

    def decode(self, ids: Any, decode_special_tokens: bool = False) -> str:
        """Text of a list / 1-D tensor / (1, n) tensor of ids; special tokens dropped unless asked for."""
        if isinstance(ids, torch.Tensor):
            if ids.dim() == 2:
                if ids.shape[0] != 1:
                    raise ValueError(f"decode() takes one sequence, got a batch of shape {tuple(ids.shape)}")
                ids = ids[0]
            ids = ids.tolist()
        elif isinstance(ids, int):
            ids = [ids]
        bad = [i for i in ids if not 0 <= i < self.vocab_size]
        if bad:
            raise ValueError(f"token ids out of range [0, {self.vocab_size}): {bad[:5]}")
        return self._tok.decode(list(ids), skip_special_tokens=not decode_special_tokens)

    def token_to_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    def token_bytes(self, token_id: int) -> bytes:
        """The raw bytes a token contributes to decoded text (partial UTF-8 included)."""
        return self._all_bytes[token_id]

    @cached_property
    def _all_bytes(self) -> list[bytes]:
        added = {i: t.content for i, t in self._tok.get_added_tokens_decoder().items()}
        out = []
        for i in range(self.vocab_size):
            if i in added:
                out.append(added[i].encode())
                continue
            piece = self._tok.id_to_token(i) or ""
            if self._byte_level and all(c in _BYTE_OF_CHAR for c in piece):
                out.append(bytes(_BYTE_OF_CHAR[c] for c in piece))
            elif m := _BYTE_FALLBACK.match(piece):
                out.append(bytes([int(m.group(1), 16)]))
            else:  # SentencePiece-style BPE: "▁" is a space (decode() would strip it at the start)
                out.append(piece.replace("\u2581", " ").encode())
        return out

    @cached_property
    def pieces(self) -> list[str]:
        """Each token's text on its own (invalid UTF-8 replaced), for n-gram and banned-string matching."""
        return [b.decode("utf-8", errors="replace") for b in self._all_bytes]

    # ------------------------------------------------------------------ chat
    @property
    def chat_template(self) -> str | None:
        """The model's own jinja2 chat template (None: it has none; see chat_format). Settable, e.g. to
        replace a bad one."""
        return self._chat_template

    @chat_template.setter
    def chat_template(self, template: str | None) -> None:
        self._chat_template, self._template, self._format = template, None, None

    @property
    def chat_format(self) -> ChatFormat:
        """The prompt format chats are rendered with, decided by engine.model.chat_format's rule (or the
        override set_chat_format chose), naming itself in .label."""
        if self._format is None:
            self._format = decide(self._chat_template, lambda t: self._tok.token_to_id(t) is not None, self.arch,
                                  self._format_choice, self.add_bos)
        return self._format

    def set_chat_format(self, choice: str = AUTO) -> ChatFormat:
        """Override the rule: "auto", "model", a family key ("chatml", "llama3", ...), "plain" or a Jinja
        file's path; ValueError (the old format kept) when the choice is unknown or the file unreadable."""
        fmt = decide(self._chat_template, lambda t: self._tok.token_to_id(t) is not None, self.arch, choice,
                     self.add_bos)
        self._format_choice, self._format, self._template = choice, fmt, None
        return fmt

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True, **kwargs: Any) -> str:
        """Render messages with the chat format's template (chat_format) in a sandboxed jinja2. A template
        that reads contents only as parts (a VLM's, engine.chat.content_parts) gets each string content as
        one text part, so a chat without images renders its words there too. A harmony model's chats
        (chat_format.harmony) are rendered by engine.chat.harmony_render, with the same arguments."""
        if self.chat_format.harmony:
            from ...chat.harmony_render import render_harmony

            return render_harmony(messages, add_generation_prompt, **kwargs)
        if self._template is None:
            template = _compile_template(self.chat_format.template)
            render = partial(template.render, add_generation_prompt=True, bos_token=self.bos_token or "",
                             eos_token=self.eos_token or "")
            self._template = template, takes_content_parts(lambda probe: render(messages=probe))
        template, parts = self._template
        return template.render(messages=as_parts(messages) if parts else messages,
                               add_generation_prompt=add_generation_prompt,
                               bos_token=self.bos_token or "", eos_token=self.eos_token or "", **kwargs)

    def __repr__(self) -> str:
        return f"Tokenizer(vocab_size={self.vocab_size}, source={self.source!r})"


def _compile_template(source: str):
    from jinja2 import TemplateError
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise TemplateError(message)

    def tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None,
               sort_keys: bool = False) -> str:
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    try:
        return env.from_string(source)
    except TemplateError as e:
        raise ValueError(f"invalid chat template: {e}") from None


def _is_byte_level(tok: HFTokenizer) -> bool:
    return tok.decoder is not None and "ByteLevel" in repr(tok.decoder)


def _token_text(value: Any) -> str | None:
    if isinstance(value, dict):  # AddedToken serialised by transformers
        return value.get("content")
    return value


def _read_json(path: Path) -> dict:
    if not path.is_file():
        return {}
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path} is not valid JSON: {e}") from None
