"""A word-wrapped label that asks for the height its text needs at its current width.

Qt's word-wrapped QLabel reports one fixed guess as its minimum height; inside a splitter or a nested
layout (which ignore height-for-width) a narrow dock then gives it fewer lines than its text wraps to and
the last line is cut off. This label's minimum height is its height for the width it has now, refreshed as
the width or the text changes, so any layout keeps every wrapped line; its width never widens the dock.
"""
from __future__ import annotations

from PySide6.QtCore import QSize
from PySide6.QtWidgets import QLabel, QSizePolicy, QWidget


class WrapLabel(QLabel):
    def __init__(self, text: str = "", parent: QWidget | None = None) -> None:
        super().__init__(text, parent)
        self.setWordWrap(True)
        self.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Fixed)
        self._height = -1

    def minimumSizeHint(self) -> QSize:  # noqa: N802 (Qt naming)
        hint = super().minimumSizeHint()
        if self.width() > 0:
            hint.setHeight(max(self.heightForWidth(self.width()), 0))
        return QSize(0, hint.height())

    def sizeHint(self) -> QSize:  # noqa: N802
        hint = super().sizeHint()
        if self.width() > 0:
            hint.setHeight(self.minimumSizeHint().height())
        return hint

    def setText(self, text: str) -> None:  # noqa: N802
        super().setText(text)
        self._refit()

    def resizeEvent(self, event) -> None:  # noqa: N802
        super().resizeEvent(event)
        self._refit()

    def _refit(self) -> None:
        height = self.heightForWidth(self.width()) if self.width() > 0 else -1
        if height != self._height:
            self._height = height
            self.updateGeometry()
