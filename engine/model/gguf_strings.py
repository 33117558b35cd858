"""A GGUF metadata array of strings (a vocabulary, its merges: 10^5 entries) read with numpy over the mapped
bytes instead of string by string.

Each string is a little-endian u64 length and that many UTF-8 bytes, so where the i-th starts depends on
every length before it. Walked one at a time in Python (an unpack, a slice and a decode each) it costs
~0.5 us a string. Here the lengths are located at once: every offset whose length bytes 1..7 are zero
(strings under 256 bytes: tokens and merges) is a candidate, each candidate points to the next string
(offset + 8 + length), candidates nothing points to (runs of zero bytes that are not lengths) drop out, and
the chain from the array's first offset is then checked link by link, so a located array is exactly the
one the walk finds. The bodies are joined with NUL separators in one numpy selection and decoded in one
call. What this does not cover (a string of 256 bytes or more, a NUL inside a string, a chain that does
not check out) takes the walk. Measured: 2-4x less CPU than the walk on 49k- and 262k-token vocabularies.
"""

from __future__ import annotations

import struct

import numpy as np

_PRUNE_ROUNDS = 16  # stray candidates pointing at stray candidates: each round drops one level of them


def read_strings(buf, pos: int, count: int) -> tuple[list[str], int]:
    """The `count` strings of the array whose first length is at byte `pos` of `buf`, and the offset after
    them. Raises UnicodeDecodeError (invalid UTF-8) or struct.error (the array runs past the end)."""
    located = _locate(buf, pos, count)
    if located is None:
        return _walk(buf, pos, count, decode=True)
    starts, ends = located
    if count == 0:
        return [], pos
    region = np.frombuffer(buf, np.uint8, count=int(ends[-1]) - pos, offset=pos)
    boundary = np.zeros(region.size + 1, dtype=np.int8)  # +1 opens a body (and the separator before it)
    boundary[starts - pos - 1] = 1  # distinct offsets: a body's separator slot is never another's end
    boundary[ends - pos] = -1
    joined = region[np.cumsum(boundary[:-1], dtype=np.int8) > 0]
    # joined = [sep body sep body ...]: the separator slots hold the last length byte, which is zero (the
    # candidates' bytes 1..7 are) -- unless a body itself holds a NUL, which would split it: walk then
    if np.count_nonzero(joined == 0) != count:
        return _walk(buf, pos, count, decode=True)
    return joined.tobytes().decode("utf-8").split("\x00")[1:], int(ends[-1])


def skip_strings(buf, pos: int, count: int) -> int:
    """The offset after the array of `count` strings starting at byte `pos` (nothing decoded)."""
    located = _locate(buf, pos, count)
    if located is None:
        return _walk(buf, pos, count, decode=False)[1]
    return int(located[1][-1]) if count else pos


def _locate(buf, pos: int, count: int) -> tuple[np.ndarray, np.ndarray] | None:
    """(body starts, body ends) as absolute offsets, or None where the vectorized search cannot vouch for
    them (then the caller walks)."""
    if count == 0:
        return np.empty(0, np.int64), np.empty(0, np.int64)
    size = len(buf)
    window = min(size - pos, count * 24 + 64)
    while True:
        if window < 8:
            return None
        b = np.frombuffer(buf, np.uint8, count=window, offset=pos)
        zero = b == 0
        n = window - 7  # offsets whose 8 length bytes lie in the window
        mask = zero[1:1 + n].copy()
        for i in range(2, 8):
            mask &= zero[i:i + n]
        cand = np.flatnonzero(mask)
        if cand.size == 0 or cand[0] != 0:
            return None  # the first string is 256 bytes or longer
        nxt = cand + 8 + b[cand]
        if not (cand.size >= count and np.array_equal(nxt[:count - 1], cand[1:count])):
            for _ in range(_PRUNE_ROUNDS):
                at = np.minimum(np.searchsorted(cand, nxt), cand.size - 1)
                pointed = np.zeros(cand.size, dtype=bool)
                pointed[at[cand[at] == nxt]] = True
                pointed[0] = True
                if pointed.all():
                    break
                cand, nxt = cand[pointed], nxt[pointed]
        if cand.size >= count:
            if not np.array_equal(nxt[:count - 1], cand[1:count]) or pos + int(nxt[count - 1]) > size:
                return None
            return cand[:count] + (pos + 8), nxt[:count] + pos
        if window >= size - pos:
            return None
        window = min(size - pos, window * 2)


def _walk(buf, pos: int, count: int, decode: bool) -> tuple[list[str], int]:
    """The sequential reading: one length at a time."""
    out, unpack, size = [], struct.unpack_from, len(buf)
    for _ in range(count):
        (n,) = unpack("<Q", buf, pos)
        start, pos = pos + 8, pos + 8 + n
        if pos > size:
            raise struct.error("string runs past the end of the file")
        if decode:
            out.append(bytes(buf[start:pos]).decode("utf-8"))
    return out, pos
