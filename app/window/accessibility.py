"""Accessible names for the widgets a screen reader lands on, where the widget does not say itself.

Qt names a button after its text, but a text box, list, combo box, spin box or slider has no name of its own:
a screen reader says "edit text" and nothing more. The chat views name their main widgets themselves
(the message box after its chat, the transcript, the compare chips); `name_widgets` gives every other
focusable widget under a panel the name a sighted user reads next to it: its form label (QFormLayout row
or QLabel buddy), else its group box's title, else its placeholder text, else its tooltip's first line.
A widget that already has a name keeps it.
"""
from __future__ import annotations

from PySide6.QtCore import QModelIndex, Qt
from PySide6.QtGui import QAccessible
from PySide6.QtWidgets import QAbstractButton, QFormLayout, QGroupBox, QLabel, QTableView, QTreeView, QWidget


def accessible_name(widget: QWidget) -> str:
    """What a screen reader says the widget is called (the name its accessibility interface reports)."""
    iface = QAccessible.queryAccessibleInterface(widget)
    return iface.text(QAccessible.Text.Name).strip() if iface is not None else ""


def focusable(widget: QWidget) -> bool:
    return bool(widget.focusPolicy() & Qt.FocusPolicy.TabFocus)


def name_widgets(root: QWidget) -> None:
    """Name every focusable widget under `root` (and root) that has no accessible name (see the module)."""
    labels = _form_labels(root)
    for widget in [root, *root.findChildren(QWidget)]:
        if not focusable(widget) or widget.accessibleName() or accessible_name(widget):
            continue
        name = labels.get(widget) or _derived(widget)
        if name:
            widget.setAccessibleName(name)


def _form_labels(root: QWidget) -> dict[QWidget, str]:
    """Each field's label: QLabel buddies and QFormLayout rows (a row whose field is a layout names the
    widgets in it)."""
    out: dict[QWidget, str] = {}
    for label in root.findChildren(QLabel):
        if label.buddy() is not None and label.text():
            out.setdefault(label.buddy(), _clean(label.text()))
    for form in root.findChildren(QFormLayout):
        for row in range(form.rowCount()):
            label = form.itemAt(row, QFormLayout.ItemRole.LabelRole)
            field = form.itemAt(row, QFormLayout.ItemRole.FieldRole)
            text = _clean(label.widget().text()) if label is not None and isinstance(label.widget(), QLabel) else ""
            if field is None or not text:
                continue
            for widget in _widgets_of(field):
                out.setdefault(widget, text if isinstance(widget, QAbstractButton) is False else
                               f"{text}: {_clean(widget.text()) or widget.toolTip()}")
    return out


def _widgets_of(item) -> list[QWidget]:
    if item.widget() is not None:
        return [item.widget(), *item.widget().findChildren(QWidget)]
    layout = item.layout()
    out: list[QWidget] = []
    for i in range(layout.count() if layout is not None else 0):
        out += _widgets_of(layout.itemAt(i))
    return out


def _derived(widget: QWidget) -> str:
    for source in (getattr(widget, "placeholderText", None), widget.toolTip, widget.windowTitle):
        text = source() if callable(source) else ""
        if text:
            return _clean(text.splitlines()[0])
    parent = widget.parentWidget()
    while parent is not None:  # a field alone in a titled box: the box's title; else its panel's name
        if isinstance(parent, QGroupBox) and parent.title():
            return _clean(parent.title())
        if parent.accessibleName():
            return f"{parent.accessibleName()}: {_columns(widget)}" if _columns(widget) else parent.accessibleName()
        parent = parent.parentWidget()
    return ""


def _columns(widget: QWidget) -> str:
    """A table or tree's column titles ("Model, Downloads, Likes"), which say what it lists."""
    model = widget.model() if isinstance(widget, (QTableView, QTreeView)) else None
    if model is None:
        return ""
    titles = [model.headerData(c, Qt.Orientation.Horizontal) for c in range(model.columnCount(QModelIndex()))]
    return ", ".join(str(t) for t in titles if t)


def _clean(text: str) -> str:
    """A label as spoken: no & mnemonic, no trailing colon or "…"."""
    return text.replace("&&", "\0").replace("&", "").replace("\0", "&").strip().rstrip(":…").strip()
