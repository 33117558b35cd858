"""What the app soak reads at each sample: the process's memory, split by who holds it, and what the chats
legitimately hold, so that growth from longer chats (data) can be told from growth that nothing explains
(a leak).

- RSS (/proc/self/status) and glibc's heap (mallinfo2: in use = arena chunks in use + mmapped chunks;
  kept = freed chunks the arenas keep), so a growth in RSS can be told from fragmentation;
- live Qt objects under the window (C++ QObjects) and the Python wrappers of Qt types the collector tracks;
- the chats' content: open chats, messages, characters of their text, characters and blocks of their
  transcript documents (Qt keeps a layout per block).
"""
from __future__ import annotations

import ctypes
import gc


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


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024


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


def qt_wrappers() -> int:
    """Python objects of PySide6 types the collector tracks (wrappers kept alive from Python)."""
    return sum(1 for o in gc.get_objects() if str(getattr(type(o), "__module__", "")).startswith("PySide6"))


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


def sample(window, replies: int, seconds: float) -> dict:
    in_use, kept = heap_mb()
    return {"replies": replies, "s": round(seconds, 1), "rss": round(rss_mb(), 1), "heap": round(in_use, 1),
            "kept": round(kept, 1), "qt": live_qt_objects(window), "wrappers": qt_wrappers(), **content(window)}


def slope_per_1000(samples: list[dict], key: str) -> float:
    """Least-squares growth of samples[key] per 1000 replies (0 with fewer than two samples)."""
    if len(samples) < 2:
        return 0.0
    xs, ys = [s["replies"] for s in samples], [s[key] for s in samples]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    den = sum((x - mx) ** 2 for x in xs)
    return 0.0 if den == 0 else sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / den * 1000
