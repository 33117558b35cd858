"""Streaming repaints stay local: setting a label to the text (or width) it has never relays out the window.

A streaming pane sets its title, state and context meter at every repaint; before, each set asked the layout
again, the request climbed ChatPane -> splitter -> ChatArea -> MainWindow, and the whole window was relaid
out and most of it repainted several times a second per chat.
"""
from __future__ import annotations

from PySide6.QtCore import QEvent, QObject

from app.chat.pane_widgets import ElidedLabel
from tests.app.support import loaded_service, loop, make_window, run, store, tiny_model, wait_until  # noqa: F401


class LayoutRequests(QObject):
    """Counts LayoutRequest events delivered to the watched widget."""

    def __init__(self, widget):
        super().__init__()
        self.count = 0
        widget.installEventFilter(self)

    def eventFilter(self, _obj, event) -> bool:  # noqa: N802
        if event.type() == QEvent.Type.LayoutRequest:
            self.count += 1
        return False


def test_an_elided_label_asks_the_layout_only_when_its_size_hint_changes(qtbot, qapp):
    from PySide6.QtWidgets import QHBoxLayout, QWidget

    parent = QWidget()
    qtbot.addWidget(parent)
    label = ElidedLabel("12 tok/s")
    QHBoxLayout(parent).addWidget(label)
    parent.show()
    qapp.processEvents()
    requests = LayoutRequests(parent)
    for _ in range(5):
        label.setText("12 tok/s")
    qapp.processEvents()
    assert requests.count == 0 and label.text() == "12 tok/s"
    label.setText("13 tok/s")  # same width in most fonts; either way the text is the new one
    qapp.processEvents()
    before = requests.count
    label.setText("a much longer state line than before, 13 tok/s")
    qapp.processEvents()
    assert requests.count == before + 1
    assert label.text() == "a much longer state line than before, 13 tok/s"
    assert label.toolTip() == "a much longer state line than before, 13 tok/s"


def test_four_streaming_chats_do_not_relay_out_the_main_window_at_each_repaint(qtbot, loop, store, tiny_model):
    from app.core.store import ChatSettings

    async def body():
        window = make_window(qtbot, store, await loaded_service(tiny_model))
        window.resize(1400, 800)
        panes = [window.new_chat(f"chat {i + 1}") for i in range(4)]
        window.chats.show_side_by_side(panes)
        renders = [0]
        for i, p in enumerate(panes):
            p.session.set_settings(ChatSettings(max_new_tokens=300, seed=i))
            original = p.render_stream

            def counted(original=original):
                renders[0] += 1
                original()
            p.render_stream = counted
        await wait_until(lambda: True)
        requests = LayoutRequests(window)
        for i, p in enumerate(panes):
            p.send(f"Tell me a long story number {i}.")
        await wait_until(lambda: not any(p.session.running for p in panes), 120, "the replies")
        result = renders[0], requests.count
        await window.shutdown()
        return result

    renders, relayouts = run(loop, body(), 180)
    assert renders >= 20, renders  # the panes really streamed
    assert relayouts <= renders / 5, (relayouts, renders)
