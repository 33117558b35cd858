"""What the app soak reads at each sample: the process's memory, split by who holds it, and what the chats
legitimately hold, so that growth from longer chats (data) can be told from growth that nothing explains
(a leak).

- RSS (/proc/self/status), threads, Python's allocated blocks (its own arenas are mmapped, outside
  glibc's figures) and glibc's heap (mallinfo2: in use = arena chunks in use + mmapped chunks;
  kept = freed chunks the arenas keep), so a growth in RSS can be told from fragmentation;
- live Qt objects under the window (C++ QObjects) and the Python wrappers of Qt types the collector tracks;
- the chats' content: open chats, messages, characters of their text, characters and blocks of their
  transcript documents (Qt keeps a layout per block).
"""
from __future__ import annotations

import collections
import ctypes
import gc
import sys


class _Mallinfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]


def _mallinfo2():
    try:
        libc = ctypes.CDLL("libc.so.6")
        fn = libc.mallinfo2
    except (OSError, AttributeError):  # not glibc, or glibc < 2.33
        return None
    fn.restype = _Mallinfo2
    return fn


_MALLINFO2 = _mallinfo2()
MB = 1024 * 1024


def status_mb(*keys: str) -> list[float]:
    """Fields of /proc/self/status in MB: VmRSS, and its parts RssAnon (heap, stacks) and RssFile (mapped
    files: the model's weights when mapped, libraries)."""
    with open("/proc/self/status") as f:
        found = dict(line.split(":", 1) for line in f)
    return [int(found[k].split()[0]) / 1024 for k in keys]


def rss_mb() -> float:
    return status_mb("VmRSS")[0]


def heap_mb() -> tuple[float, float]:
    """(in use, freed but kept) in MB; (0, 0) without glibc's mallinfo2."""
    if _MALLINFO2 is None:
        return 0.0, 0.0
    m = _MALLINFO2()
    return (m.uordblks + m.hblkhd) / MB, m.fordblks / MB


def live_qt_objects(window) -> int:
    """C++ QObjects under the window plus every top-level widget (dialogs, menus)."""
    from PySide6.QtCore import QObject
    from PySide6.QtWidgets import QApplication

    return len(window.findChildren(QObject)) + len(QApplication.topLevelWidgets())


def qt_wrappers() -> tuple[collections.Counter, int]:
    """Python objects of PySide6 types the collector tracks, by type, whose C++ object lives; and the number
    of those whose C++ object is gone. The dead ones are the meter's own: the wrappers findChildren() makes
    are kept by the window's wrapper after their objects are deleted (seen with gc.get_referrers)."""
    import shiboken6

    live, dead = collections.Counter(), 0
    for o in gc.get_objects():
        if str(getattr(type(o), "__module__", "")).startswith("PySide6"):
            if shiboken6.isValid(o):
                live[type(o).__qualname__] += 1
            else:
                dead += 1
    return live, dead


def grown(before: collections.Counter, after: collections.Counter, top: int = 8) -> dict:
    """The types whose count grew most from before to after."""
    return dict((after - before).most_common(top))


def content(window) -> dict:
    """What the open chats hold: chats, messages, text characters, transcript characters and blocks."""
    area = window.chats
    sessions = list(area.sessions.values())
    docs = [pane.view.document() for pane in area.panes.values()]
    return {"chats": len(sessions),
            "messages": sum(len(s.messages) for s in sessions),
            "text_chars": sum(len(m.content or "") for s in sessions for m in s.messages),
            "doc_chars": sum(d.characterCount() for d in docs),
            "doc_blocks": sum(d.blockCount() for d in docs)}


def sample(window, replies: int, seconds: float, wrappers: collections.Counter | None = None) -> dict:
    """One row of figures; `wrappers` (if given) is updated to the wrapper counts by type."""
    in_use, kept = heap_mb()
    qt = live_qt_objects(window)  # first: the wrappers it makes for objects not yet wrapped are then counted
    by_type, dead = qt_wrappers()
    if wrappers is not None:
        wrappers.clear()
        wrappers.update(by_type)
    rss, anon, mapped = status_mb("VmRSS", "RssAnon", "RssFile")
    threads = int(status_mb("Threads")[0] * 1024)
    return {"replies": replies, "s": round(seconds, 1), "rss": round(rss, 1), "anon": round(anon, 1),
            "file": round(mapped, 1), "heap": round(in_use, 1), "py_blocks": sys.getallocatedblocks(),
            "threads": threads,
            "kept": round(kept, 1), "qt": qt, "wrappers": sum(by_type.values()),
            "dead_wrappers": dead,
            **content(window)}


def growth_split(samples: list[dict], reloads: list[int], key: str) -> tuple[float, float]:
    """(growth of samples[key] per 1000 replies between reloads, mean step across a reload).

    The growth is a least-squares slope over every sample, each stretch between two reloads with its own
    level (a fixed-effects fit): a sum of first-to-last differences per stretch would hang on a few
    samples each, and RSS swings a few MB from one sample to the next (a sampler's or a step's buffers
    freed or not yet), which over a few hundred replies reads as tens of MB per 1000. A steady leak moves
    every sample, so the slope sees it with all of them. The step is the mean change over the sample
    intervals that span a reload."""
    segments: list[list[tuple[int, float]]] = [[]]
    for a, b in zip([None, *samples], samples):
        if a is not None and any(a["replies"] <= r < b["replies"] for r in reloads):
            segments.append([])
        segments[-1].append((b["replies"], b[key]))
    sxy = sxx = 0.0
    for seg in segments:
        if len(seg) < 2:
            continue
        mx, my = sum(x for x, _ in seg) / len(seg), sum(y for _, y in seg) / len(seg)
        sxy += sum((x - mx) * (y - my) for x, y in seg)
        sxx += sum((x - mx) ** 2 for x, _ in seg)
    across = [b[key] - a[key] for a, b in zip(samples, samples[1:])
              if any(a["replies"] <= r < b["replies"] for r in reloads)]
    return (sxy / sxx * 1000 if sxx else 0.0, sum(across) / len(across) if across else 0.0)
