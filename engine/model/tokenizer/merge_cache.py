"""The BPE merges a SentencePiece GGUF implies, kept on disk between loads of the same file.

Recovering the merges of a 262k-piece SentencePiece vocabulary (spm_merges: ~2M candidate splits hashed,
matched and sorted) is most of a Gemma-3 file's tokenizer build, and its result depends on the file's header
alone. So the result is kept under the user cache directory (PAGEDECK_TOKENIZER_CACHE, engine.envs), one
entry per file version, as int32 token ids (positions in the file's token list): each merge's left and right
piece, one pair after the other, and the tokens whose text the build renames (Gemma's whitespace runs, which
the file writes with real spaces). With those, a load makes the merge list straight from the token list (one
numpy selection) and steps through no token in Python.

An entry is trusted only when everything checks: its name is the file's version key (GGUFFile.version_key: a
BLAKE2b digest of the file's size, modification time and whole header, which holds the vocabulary, scores and
architecture the merges come from), so a changed file never meets an old entry; inside, a magic and this
module's VERSION (read first, at the same place in every version, so an entry of another layout is rejected
before anything else in it is read), the token count, the merge and rename counts and a BLAKE2b digest of the
arrays must match and every id must name a token. Anything else (an entry of another version, a truncated,
corrupt or foreign file) is rebuilt from the vocabulary and written again. Entries are written to a temporary
file and renamed into place, so a reader never sees half of one; a cache that cannot be written (read-only,
full disk) is skipped, never an error.
"""

from __future__ import annotations

import hashlib
import os
import struct
import tempfile
from pathlib import Path
from typing import NamedTuple

import numpy as np

from engine import envs

VERSION = 2  # bump whenever an entry's layout, or what gguf_vocab builds from the same header, changes
_MAGIC = b"PDMERGES"
_TAG = struct.Struct("<8sI")  # magic, version: the start of an entry of any version
_HEAD = struct.Struct("<8sIqqq32s")  # magic, version, tokens, merges, renamed, digest of the arrays


class Entry(NamedTuple):
    """A vocabulary's recovered merges, as token ids."""

    pairs: np.ndarray  # (merges, 2) int32: each merge's left and right piece, best merge first
    renamed: np.ndarray  # int32: the tokens whose spaces the build writes as SentencePiece's visible space


def cache_dir() -> Path | None:
    """Where entries live: PAGEDECK_TOKENIZER_CACHE, by default the user cache's pagedeck/tokenizers
    folder; None where it is set to 0 (no cache)."""
    value = envs.PAGEDECK_TOKENIZER_CACHE
    if value is False:
        return None
    if value is None:
        import platformdirs

        return Path(platformdirs.user_cache_dir("pagedeck", appauthor=False)) / "tokenizers"
    return value


def _digest(pairs: np.ndarray, renamed: np.ndarray) -> bytes:
    h = hashlib.blake2b(digest_size=32)
    h.update(pairs.tobytes())
    h.update(renamed.tobytes())
    return h.digest()


def load(key: str, tokens: int) -> Entry | None:
    """The entry `key` for a vocabulary of `tokens` tokens, or None where there is no entry or it fails any
    check (module docstring)."""
    folder = cache_dir()
    if folder is None:
        return None
    try:
        data = (folder / f"{key}.merges").read_bytes()
    except OSError:
        return None
    if len(data) < _TAG.size or _TAG.unpack_from(data) != (_MAGIC, VERSION) or len(data) < _HEAD.size:
        return None
    _, _, n_tokens, n_merges, n_renamed, digest = _HEAD.unpack_from(data)
    if n_tokens != tokens or n_merges < 0 or n_renamed < 0 \
            or len(data) != _HEAD.size + 4 * (2 * n_merges + n_renamed):
        return None
    ids = np.frombuffer(data, np.int32, 2 * n_merges + n_renamed, _HEAD.size)
    entry = Entry(ids[:2 * n_merges].reshape(n_merges, 2), ids[2 * n_merges:])
    if _digest(*entry) != digest or (ids.size and (ids.min() < 0 or ids.max() >= tokens)):
        return None
    return entry


def store(key: str, tokens: int, entry: Entry) -> None:
    """Write `entry` under `key` (atomically); a cache that cannot be written is left as it is."""
    folder = cache_dir()
    if folder is None:
        return
    pairs = np.ascontiguousarray(entry.pairs, np.int32).reshape(-1, 2)
    renamed = np.ascontiguousarray(entry.renamed, np.int32).reshape(-1)
    head = _HEAD.pack(_MAGIC, VERSION, tokens, len(pairs), renamed.size, _digest(pairs, renamed))
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{key}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(head)
                f.write(pairs.tobytes())
                f.write(renamed.tobytes())
            os.replace(tmp, folder / f"{key}.merges")
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    except OSError:
        pass
