"""MMEmbedding: vectors (an image's, as a vision encoder produced them) that stand in a prompt for tokens.

As in ExLlamaV2, a prompt refers to an embedding by placeholder token ids from FIRST_ID (1e9) up, one id
per vector; the model looks ids >= FIRST_ID up in the job's embeddings instead of its token table
(engine.model.model.Model.forward). The ids are what the page table hashes, so they decide prefix sharing:
the registry here hands the same id range to the same content_hash (the image bytes and the encoder that
produced the vectors) for the life of the process, so the same image in two chats gives the same ids and
shares cached pages, while any other embedding gets a range of its own and never does.
"""
from __future__ import annotations

import threading

import torch

FIRST_ID = 1_000_000_000  # placeholder ids start here (ExLlamaV2's value): far above any vocabulary


class _Registry:
    """content_hash -> (first id, length), and the next free id: ranges are never reused in a process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._next = FIRST_ID
        self._ranges: dict[bytes, tuple[int, int]] = {}

    def reserve(self, length: int, content_hash: bytes | None) -> int:
        with self._lock:
            if content_hash is not None and content_hash in self._ranges:
                first, n = self._ranges[content_hash]
                if n == length:
                    return first
                # the same hash with another length is another encoding: it must not share K/V
                content_hash = content_hash + length.to_bytes(8, "little")
                if content_hash in self._ranges:
                    return self._ranges[content_hash][0]
            first = self._next
            self._next += length
            if content_hash is not None:
                self._ranges[content_hash] = (first, length)
            return first


_REGISTRY = _Registry()


class MMEmbedding:
    """An embedding to put in a prompt: `embeddings` (n_tokens, hidden) in the model's embedding space.

    token_ids: the n placeholder ids to put in the prompt where the vectors go (consecutive, from
    first_id). content_hash: identity of the content (e.g. a hash of the image bytes and the encoder's
    name and settings); embeddings with equal hashes (and lengths) get the same ids, hence share prefix
    cache pages. None: a fresh range, never shared. text_alias: a string that stands for the embedding in
    prompt text (encode_with_embeddings replaces it by the ids); default "<$EMB_{first_id}$>"."""

    def __init__(self, embeddings: torch.Tensor, text_alias: str | None = None, content_hash: bytes | None = None):
        if not isinstance(embeddings, torch.Tensor) or embeddings.dim() != 2 or embeddings.shape[0] < 1:
            raise ValueError("embeddings must be a (n_tokens, hidden) tensor with at least one row")
        if not embeddings.dtype.is_floating_point:
            raise ValueError(f"embeddings must be floating point, got {embeddings.dtype}")
        if content_hash is not None and not isinstance(content_hash, (bytes, bytearray)):
            raise TypeError("content_hash must be bytes (e.g. hashlib.blake2b(...).digest())")
        self.embeddings = embeddings
        self.length = embeddings.shape[0]
        self.content_hash = bytes(content_hash) if content_hash is not None else None
        self.first_id = _REGISTRY.reserve(self.length, self.content_hash)
        self.text_alias = text_alias if text_alias is not None else f"<$EMB_{self.first_id}$>"

    @property
    def token_ids(self) -> list[int]:
        return list(range(self.first_id, self.first_id + self.length))

    @property
    def last_id(self) -> int:
        """One past the last placeholder id."""
        return self.first_id + self.length

    def __repr__(self) -> str:
        return f"MMEmbedding(ids={self.first_id}..{self.last_id - 1}, hidden={self.embeddings.shape[1]})"


class EmbeddingLookup:
    """The vectors behind a job's placeholder ids (several embeddings, each a consecutive id range)."""

    def __init__(self, embeddings: list[MMEmbedding]):
        for e in embeddings:
            if not isinstance(e, MMEmbedding):
                raise TypeError(f"embeddings must be engine.MMEmbedding objects, got {type(e).__name__}")
        widths = {e.embeddings.shape[1] for e in embeddings}
        if len(widths) > 1:
            raise ValueError(f"a job's embeddings must share one hidden size, got {sorted(widths)}")
        self.embeddings = list(embeddings)
        self.hidden = widths.pop() if widths else None

    def __bool__(self) -> bool:
        return bool(self.embeddings)

    def covers(self, token: int) -> bool:
        return any(e.first_id <= token < e.last_id for e in self.embeddings)

    def vectors(self, tokens: list[int]) -> tuple[list[int], torch.Tensor] | None:
        """(offsets in `tokens` of placeholder ids, their vectors stacked), or None when there are none.
        KeyError for a placeholder id no embedding of the job covers."""
        offsets = [i for i, t in enumerate(tokens) if t >= FIRST_ID]
        if not offsets:
            return None
        ids = torch.tensor([tokens[i] for i in offsets], dtype=torch.long)
        out: torch.Tensor | None = None
        found = torch.zeros(len(offsets), dtype=torch.bool)
        for e in self.embeddings:  # a few images per job: one gather each
            mine = (ids >= e.first_id) & (ids < e.last_id)
            if mine.any():
                vecs = e.embeddings[(ids[mine] - e.first_id).to(e.embeddings.device)]
                if out is None:
                    out = vecs.new_empty((len(offsets), vecs.shape[1]))
                out[mine.to(out.device)] = vecs.to(out.dtype)
                found |= mine
        if not bool(found.all()):
            stray = ids[~found][0].item()
            raise KeyError(f"placeholder id {stray} belongs to none of the job's embeddings")
        return offsets, out


def encode_with_embeddings(tokenizer, text: str, embeddings: list[MMEmbedding], add_bos: bool = False,
                           encode_special_tokens: bool = False) -> torch.Tensor:
    """Encode text in which each embedding's text_alias stands for its placeholder ids; (1, n) int64."""
    pieces: list[tuple[str, MMEmbedding | None]] = [(text, None)]
    for e in embeddings:
        split: list[tuple[str, MMEmbedding | None]] = []
        for piece, emb in pieces:
            if emb is not None:
                split.append((piece, emb))
                continue
            parts = piece.split(e.text_alias)
            for j, part in enumerate(parts):
                if j:
                    split.append(("", e))
                split.append((part, None))
        pieces = split
    ids: list[int] = [tokenizer.bos_token_id] if add_bos else []
    for piece, emb in pieces:
        if emb is not None:
            ids += emb.token_ids
        elif piece:
            ids += tokenizer.encode(piece, encode_special_tokens=encode_special_tokens)[0].tolist()
    return torch.tensor([ids], dtype=torch.long)
