"""The window's status bar: the model the chats run on now (a permanent label) and the newest message.

Errors from anywhere in the window (a failed load, a LoRA the generator refused, an export) end up here:
the newest one stays in `last_error`, and showing it also ends a "loading… n%" label.
"""
from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QStatusBar

from app.chat.pane_widgets import ElidedLabel

MODEL_LABEL_SHARE = 60  # % of the status bar the model's label may take while a message shows


class StatusLine:
    def __init__(self, bar: QStatusBar):
        self.bar = bar
        self.model_status = ElidedLabel("no model")  # a narrow bar elides it (whole in its tooltip)
        bar.addPermanentWidget(self.model_status)
        self.last_error = ""

    def show_model(self, info: dict | None) -> None:
        """The permanent label: the local model running now (`info` as EngineService.info), or none."""
        if info is None:
            self.model_status.setText("no model")
            return
        size = info["memory_bytes"] / 2**20
        weights = f" · {info['weights']} weights" if info.get("weights") in ("packed", "q8") else ""
        self.model_status.setText(f"{info['name']} · {info['device']} {info['dtype']}{weights} · {size:.0f} MiB · "
                                  f"{info['pages']} pages")

    def show_remote(self, info: dict) -> None:
        """The permanent label while chats stream from a server (`info` as RemoteBackend.connect gives it)."""
        self.model_status.setText(f"remote · {info['model']} @ {info['url']}")

    def show_stage(self, text: str) -> None:
        """What a load is doing (compiling the kernels on a first start, then loading), until it ends."""
        self.model_status.setText(text)
        self._show(text, 0)

    def show_progress(self, fraction: float) -> None:
        self.model_status.setText(f"loading… {fraction * 100:.0f}%")

    def message(self, text: str, ms: int = 0) -> None:
        self._show(text, ms)

    def _show(self, text: str, ms: int) -> None:
        """A message elided with "…" to the room the permanent label leaves (whole in the bar's tooltip): Qt
        would cut it off mid-letter where the label starts, which reads as one garbled line."""
        cap = max(self.bar.width() * MODEL_LABEL_SHARE // 100, 200)  # the message keeps the rest of the bar
        self.model_status.setMaximumWidth(cap)
        label = min(self.model_status.sizeHint().width(), cap)
        room = self.bar.width() - label - 4 * self.bar.fontMetrics().averageCharWidth()
        shown = self.bar.fontMetrics().elidedText(text, Qt.TextElideMode.ElideRight, max(room, 0))
        self.bar.setToolTip(text if shown != text else "")
        self.bar.showMessage(shown, ms)

    def error(self, message: str, info: dict | None) -> None:
        """Show an error; the label goes back to the model running now (`info`), ending a load's progress."""
        self.last_error = message
        self.show_model(info)  # the message below stays the newest one shown
        self._show(message, 15000)
