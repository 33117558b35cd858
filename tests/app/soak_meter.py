"""What the app soak reads at each sample: the process's memory, split by who holds it, and what the chats
legitimately hold, so that growth from longer chats (data) can be told from growth that nothing explains
(a leak).

- RSS (/proc/self/status), threads, Python's allocated blocks (its own arenas are mmapped, outside
  glibc's figures) and glibc's heap (mallinfo2: in use = arena chunks in use + mmapped chunks;
  kept = freed chunks the arenas keep) and the heap in use per arena (the main thread's against the other
  threads'), so a growth in RSS can be told from fragmentation, and a growth in the heap by thread;
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


def arenas_mb() -> list[float]:
    """MB in use in each glibc arena (malloc_info: an arena's current system size less its free chunks),
    arena 0 first: the main arena serves the main thread (Qt, Python's C extensions, tokenizers called from
    the UI), the others serve other threads (the generator's, torch's, the sampling pool's), so a growth
    of the heap in use can be told by thread. That holds while the process has fewer live threads than
    glibc's arena limit (8 per core); past it glibc hands out the arenas in turn, the main one included.
    Empty without glibc."""
    import re

    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.open_memstream.restype = ctypes.c_void_p
    except (OSError, AttributeError):
        return []
    buf, size = ctypes.c_char_p(), ctypes.c_size_t()
    stream = ctypes.c_void_p(libc.open_memstream(ctypes.byref(buf), ctypes.byref(size)))
    libc.malloc_info(0, stream)
    libc.fclose(stream)
    xml = (buf.value or b"").decode()
    libc.free(buf)
    out = []
    for heap in re.findall(r'<heap nr="\d+">(.*?)</heap>', xml, re.S):
        free = sum(int(x) for x in re.findall(r'<total type="(?:fast|rest)" count="\d+" size="(\d+)"', heap))
        current = int(re.search(r'<system type="current" size="(\d+)"', heap).group(1))
        out.append((current - free) / MB)
    return out


def _malloc_mapped_mb() -> float:
    """MB in blocks glibc serves by their own mappings (mallinfo2 hblkhd)."""
    return _MALLINFO2().hblkhd / MB


_MALLOC_MAPPED_MB = _malloc_mapped_mb if _MALLINFO2 is not None else None


def live_qt_objects(window) -> int:
    """C++ QObjects under the window plus every top-level widget (dialogs, menus)."""
    from PySide6.QtCore import QObject
    from PySide6.QtWidgets import QApplication

    return len(window.findChildren(QObject)) + len(QApplication.topLevelWidgets())


def qt_wrappers() -> tuple[collections.Counter, int]:
    """Python objects of PySide6 types the collector tracks, by type, whose C++ object lives; and the number
    of those whose C++ object is gone. The dead ones are mostly the meter's own: the wrappers findChildren()
    makes are kept by the window's wrapper after their objects are deleted (seen with gc.get_referrers), so
    the long run scans only now and then (`sample`'s scan_qt)."""
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


def sample(window, replies: int, seconds: float, wrappers: collections.Counter | None = None,
           scan_qt: bool = True) -> dict:
    """One row of figures; `wrappers` (if given) is updated to the wrapper counts by type. `scan_qt` False
    leaves out the Qt object and wrapper counts (None): findChildren() wraps every object not wrapped yet and
    the window's wrapper keeps those wrappers after their objects die (the 8 chats' widgets, replaced every
    few replies), so a scan every 10 replies left ~9,400 dead wrappers per 1000 replies - heap the meter
    added to the process it measures (2 with no scans, the same run). `rss_found` is the
    RSS as the sample finds it: it includes whatever the steps freed since the generator's last trim (it
    trims when the queue drains, at most every 2 s), so it swings with the sample's phase against that
    timer; `rss` is read after a trim of our own, what the process cannot give back: the figure judged."""
    from engine.model.weights import release_freed_memory

    rss_found = rss_mb()
    release_freed_memory()
    in_use, kept = heap_mb()
    qt = live_qt_objects(window) if scan_qt else None  # first: the wrappers it makes are then counted
    by_type, dead = qt_wrappers() if scan_qt else (None, None)
    if wrappers is not None and by_type is not None:
        wrappers.clear()
        wrappers.update(by_type)
    arenas = arenas_mb()
    rss, anon, mapped = status_mb("VmRSS", "RssAnon", "RssFile")
    threads = int(status_mb("Threads")[0] * 1024)
    return {"replies": replies, "s": round(seconds, 1), "rss": round(rss, 1), "rss_found": round(rss_found, 1),
            "anon": round(anon, 1),
            "file": round(mapped, 1), "heap": round(in_use, 1), "py_blocks": sys.getallocatedblocks(),
            "threads": threads,
            "kept": round(kept, 1), "main_arena": round(arenas[0], 2) if arenas else None,
            "other_arenas": round(sum(arenas[1:]), 2) if arenas else None, "qt": qt, "wrappers": None if by_type is None else sum(by_type.values()),
            "dead_wrappers": dead,
            **content(window)}


def growth_split(samples: list[dict], reloads: list[int], key: str) -> tuple[float, float]:
    """(growth of samples[key] per 1000 replies between reloads, mean step across a reload): from
    consecutive samples, those spanning a reload apart."""
    steps = [(b["replies"] - a["replies"], b[key] - a[key], any(a["replies"] <= r < b["replies"] for r in reloads))
             for a, b in zip(samples, samples[1:])]
    replies = sum(n for n, _, spans in steps if not spans)
    across = [d for _, d, spans in steps if spans]
    return (sum(d for _, d, spans in steps if not spans) / max(1, replies) * 1000,
            sum(across) / len(across) if across else 0.0)


def slope_between(samples: list[dict], reloads: list[int], key: str, settle: int = 10) -> float:
    """Least-squares growth of samples[key] per 1000 replies between reloads: one slope shared by every
    stretch between two reloads, each stretch with its own level, so a reload's step is not counted as
    growth. Every sample weighs in, where the sum of consecutive steps (`growth_split`) is the difference
    of each stretch's two end samples and moves with either one's noise. A stretch starts `settle` replies
    after its reload: the new generator builds its working buffers over its first few replies (measured
    engine-only on the default model: +17 MB heap in use, +3-9 MB RSS in the first 10 replies after a
    reload, flat over the next 60), a one-off cost of the reload that its own bound judges."""
    stretches = collections.defaultdict(list)
    for s in samples:
        before = [r for r in reloads if r < s["replies"]]
        if before and s["replies"] - before[-1] < settle:
            continue
        stretches[len(before)].append((s["replies"], s[key]))
    sxy = sxx = 0.0
    for points in stretches.values():
        if len(points) < 2:
            continue
        mx = sum(x for x, _ in points) / len(points)
        my = sum(y for _, y in points) / len(points)
        sxy += sum((x - mx) * (y - my) for x, y in points)
        sxx += sum((x - mx) ** 2 for x, _ in points)
    return sxy / sxx * 1000 if sxx else 0.0
