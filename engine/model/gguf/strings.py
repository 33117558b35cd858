"""A GGUF metadata array of strings (a vocabulary, its merges: 10^5 entries) located and decoded with numpy
over the mapped bytes instead of string by string.

Each string is a little-endian u64 length and that many UTF-8 bytes, so where the i-th starts depends on
every length before it. Here the array is scanned in blocks of at most a few MB: in a block, every offset
whose length bytes 1..7 are zero (a string under 256 bytes, as nearly all tokens and merges are) is a
candidate, and each candidate points to the next string (offset + 8 + length). From the array's start the
chain of strings is then followed a run at a time: a run of candidates that each point to the next one
is taken whole with one numpy slice, and Python steps in only where the run stops: at a stray candidate
(zero bytes inside a body, an empty string's neighbour) that the chain jumps over, at a string of 256
bytes or more (its length read directly), and at the block's end (the next block starts there). So the
cost is a few numpy passes over the array's own bytes plus one Python step per long string, and memory
is bounded by the block whatever follows the array (a vocabulary's last string is followed by the
tensor data, which is never scanned past one block).

The bodies are joined with NUL separators in one numpy selection and decoded in one call; an array whose
strings hold NULs themselves is decoded string by string.
"""

from __future__ import annotations

import struct

import numpy as np

_BLOCK = 1 << 22  # bytes scanned at once, at most
_MIN_BLOCK = 1 << 12


def read_strings(buf, pos: int, count: int) -> tuple[list[str], int]:
    """The `count` strings of the array whose first length is at byte `pos` of `buf`, and the offset after
    them. Raises UnicodeDecodeError (invalid UTF-8) or struct.error (the array runs past the end)."""
    ends = string_ends(buf, pos, count)
    return decode_strings(buf, pos, ends), int(ends[-1]) if count else pos


def skip_strings(buf, pos: int, count: int) -> int:
    """The offset after the array of `count` strings starting at byte `pos` (nothing decoded)."""
    return int(string_ends(buf, pos, count)[-1]) if count else pos


def string_ends(buf, pos: int, count: int) -> np.ndarray:
    """Where each of the `count` strings of the array at byte `pos` ends (the offset of the next one's
    length), as int64 offsets into `buf`. struct.error where the array runs past the end of `buf`."""
    size = len(buf)
    ends = np.empty(count, np.int64)
    done, cur = 0, pos  # cur: the offset of string `done`'s length
    while done < count:
        window = min(size - cur, max(_MIN_BLOCK, min((count - done) * 24 + 64, _BLOCK)))
        if window < 8:
            raise struct.error("string array runs past the end of the file")
        b = np.frombuffer(buf, np.uint8, count=window, offset=cur)
        n = window - 7  # offsets whose 8 length bytes lie in the block
        zero = b[1:] == 0
        mask = zero[:n].copy()
        for i in range(1, 7):
            mask &= zero[i:i + n]
        del zero
        cand = np.flatnonzero(mask)
        nxt = cand + 8 + b[cand]
        succ = np.searchsorted(cand, nxt)
        # run breaks: candidates whose next string is not the following candidate (the last one never is)
        follows = (succ == np.arange(1, cand.size + 1)) & (cand[np.minimum(succ, cand.size - 1)] == nxt)
        breaks = np.flatnonzero(~follows)
        at = 0  # the offset in the block of string `done`'s length
        while done < count and at < n:
            i = int(np.searchsorted(cand, at))
            if i < cand.size and cand[i] == at:  # a run of short strings, taken at once
                last = int(breaks[np.searchsorted(breaks, i)])  # the run's final candidate (the last one breaks)
                take = min(last - i + 1, count - done)
                ends[done:done + take] = nxt[i:i + take] + cur
                done += take
                at = int(nxt[i + take - 1])
            else:  # a string of 256 bytes or more: its length read directly
                (length,) = struct.unpack_from("<Q", buf, cur + at)
                at += 8 + length
                ends[done] = cur + at
                done += 1
            if cur + at > size:
                raise struct.error("string runs past the end of the file")
        cur += at
    return ends


def decode_strings(buf, pos: int, ends: np.ndarray) -> list[str]:
    """The strings of the array at byte `pos` whose bodies end at `ends` (string_ends). UnicodeDecodeError
    where one is not UTF-8."""
    count = len(ends)
    if count == 0:
        return []
    ends = np.asarray(ends, np.int64)
    starts = np.empty(count, np.int64)
    starts[0] = pos + 8
    starts[1:] = ends[:-1] + 8
    region = np.frombuffer(buf, np.uint8, count=int(ends[-1]) - pos, offset=pos)
    boundary = np.zeros(region.size + 1, dtype=np.int8)  # +1 opens a body (and the separator before it)
    boundary[starts - pos - 1] = 1  # distinct offsets: a body's separator slot is never another's end
    boundary[ends - pos] = -1
    joined = region[np.cumsum(boundary[:-1], dtype=np.int8) > 0]
    # joined = [sep body sep body ...]: each separator slot holds its length's last byte, zero for any length
    # a file can hold -- unless a body itself holds a NUL, which would split it: decode one by one then
    if np.count_nonzero(joined == 0) != count:
        return _decode_each(buf, starts, ends)
    return joined.tobytes().decode("utf-8").split("\x00")[1:]


def _decode_each(buf, starts: np.ndarray, ends: np.ndarray) -> list[str]:
    """String by string: for arrays whose bodies hold NULs."""
    return [bytes(buf[s:e]).decode("utf-8") for s, e in zip(starts.tolist(), ends.tolist())]
