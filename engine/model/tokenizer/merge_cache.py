"""The BPE merges a SentencePiece GGUF implies, kept on disk between loads of the same file.

Recovering the merges of a 262k-piece SentencePiece vocabulary (spm_merges: ~2M candidate splits hashed,
matched and sorted) is most of a Gemma-3 file's tokenizer build, and its result depends on the file's header
alone. So the merges are kept under the user cache directory (PAGEDECK_TOKENIZER_CACHE, engine.envs), one
entry per file version, as two int32 arrays of indices into the vocabulary's pieces.

An entry is trusted only when everything checks: its name is the file's version key (GGUFFile.version_key: a
BLAKE2b digest of the file's size, modification time and whole header, which holds the vocabulary, scores and
architecture the merges come from), so a changed file never meets an old entry; inside, a magic, this module's VERSION, the piece count, the merge
count and a BLAKE2b digest of the arrays must match and every index must name a piece. Anything else (a
truncated, corrupt or foreign file) is rebuilt from the vocabulary and written again. Entries are written to
a temporary file and renamed into place, so a reader never sees half of one; a cache that cannot be written
(read-only, full disk) is skipped, never an error.
"""

from __future__ import annotations

import hashlib
import os
import struct
import tempfile
from pathlib import Path

import numpy as np

from engine import envs

VERSION = 1  # bump whenever spm_merges' result for the same header could change
_MAGIC = b"PDMERGES"
_HEAD = struct.Struct("<8sIqq32s")  # magic, version, pieces, merges, digest of the arrays


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


def _digest(left: np.ndarray, right: np.ndarray) -> bytes:
    h = hashlib.blake2b(digest_size=32)
    h.update(left.tobytes())
    h.update(right.tobytes())
    return h.digest()


def load(key: str, pieces: int) -> tuple[np.ndarray, np.ndarray] | None:
    """(left, right) piece indices of the entry `key` for a vocabulary of `pieces` pieces, or None where
    there is no entry or it fails any check (module docstring)."""
    folder = cache_dir()
    if folder is None:
        return None
    try:
        data = (folder / f"{key}.merges").read_bytes()
    except OSError:
        return None
    if len(data) < _HEAD.size:
        return None
    magic, version, n_pieces, n_merges, digest = _HEAD.unpack_from(data)
    if magic != _MAGIC or version != VERSION or n_pieces != pieces or n_merges < 0 \
            or len(data) != _HEAD.size + 8 * n_merges:
        return None
    arrays = np.frombuffer(data, np.int32, 2 * n_merges, _HEAD.size)
    left, right = arrays[:n_merges], arrays[n_merges:]
    if _digest(left, right) != digest:
        return None
    if n_merges and (min(left.min(), right.min()) < 0 or max(left.max(), right.max()) >= pieces):
        return None
    return left, right


def store(key: str, pieces: int, left: np.ndarray, right: np.ndarray) -> None:
    """Write the entry `key` (atomically); a cache that cannot be written is left as it is."""
    folder = cache_dir()
    if folder is None:
        return
    left, right = np.ascontiguousarray(left, np.int32), np.ascontiguousarray(right, np.int32)
    head = _HEAD.pack(_MAGIC, VERSION, pieces, left.size, _digest(left, right))
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{key}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(head)
                f.write(left.tobytes())
                f.write(right.tobytes())
            os.replace(tmp, folder / f"{key}.merges")
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    except OSError:
        pass
