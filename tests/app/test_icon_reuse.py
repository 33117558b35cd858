"""The chat list's and tabs' activity marks and the bundled icons are one QIcon per look, made once.

Qt's QPixmapCache keeps each icon's rendered pixmaps under that icon's own key until its 10 MB budget evicts
them; icons drawn afresh at each activity change (a few per reply) or for each new pane filled it with copies
of the same squares on the main thread's heap (the long app soak's main-arena growth between reloads).
"""
from __future__ import annotations

import gc

from tests.app.soak_meter import arenas_mb


def test_the_same_look_is_the_same_icon(qapp):
    from app.chat.pane_widgets import activity_icon
    from app.preferences.icons import icon

    assert activity_icon("streaming", (10, 20, 30)).cacheKey() == activity_icon("streaming", (10, 20, 30)).cacheKey()
    assert activity_icon("queued", (10, 20, 30)).cacheKey() != activity_icon("streaming", (10, 20, 30)).cacheKey()
    assert icon("copy").cacheKey() == icon("copy").cacheKey()
    assert icon("copy").cacheKey() != icon("edit").cacheKey()


def test_activity_marks_leave_the_main_heap_flat(qapp):
    """1000 rounds of 8 chats' marks in a shown list and tab bar, as replies start and end."""
    from PySide6.QtWidgets import QListWidget, QListWidgetItem, QTabWidget, QWidget

    from app.chat.pane_widgets import activity_icon
    from engine.model.weights import release_freed_memory

    if not arenas_mb():
        return  # not glibc: nothing to read
    chats, tabs = QListWidget(), QTabWidget()
    for k in range(8):
        tabs.addTab(QWidget(), f"chat {k}")
    chats.show()
    tabs.show()

    def rounds(n: int) -> float:
        for i in range(n):
            chats.clear()
            for k in range(8):
                item = QListWidgetItem(f"chat {k}")
                chats.addItem(item)
                state = "streaming" if k == i % 8 else "queued"
                item.setIcon(activity_icon(state, (30 * k, 100, 200)))
                tabs.setTabIcon(k, activity_icon(state, (30 * k, 100, 200)))
            chats.repaint()
            tabs.repaint()
            qapp.processEvents()
        gc.collect()
        release_freed_memory()
        return arenas_mb()[0]

    before = rounds(100)  # warm-up: fonts, style, the icons themselves
    grew = rounds(1000) - before
    chats.close()
    tabs.close()
    assert grew < 1.0, f"the main arena grew {grew:.1f} MB over 1000 rounds of activity marks"
