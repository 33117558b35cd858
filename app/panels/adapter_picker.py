"""AdapterPicker: a chat's LoRA adapters and scales, picked from the adapters the generator has loaded.

Lives in the chat settings dialog. "Default" (None) follows the LoRA panel's default set; otherwise the
checked adapters with their scales ([] = the base model). Adapters a chat names that are no longer
loaded stay listed (marked) so opening the dialog never silently drops a choice.
"""
from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QCheckBox, QDoubleSpinBox, QHeaderView, QTableWidget, QTableWidgetItem, QVBoxLayout, QWidget,
)

from app.panels.wheel_guard import guard_wheel


class AdapterPicker(QWidget):
    def __init__(self, loaded: list[str], value: tuple[tuple[str, float], ...] | None, parent: QWidget | None = None):
        super().__init__(parent)
        self.use_default = QCheckBox("Use the LoRA panel's default set")
        self.table = QTableWidget(0, 2)
        self.table.setHorizontalHeaderLabels(["adapter", "scale"])
        self.table.verticalHeader().hide()
        self.table.horizontalHeader().setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
        self.table.setMaximumHeight(110)
        chosen = dict(value or ())
        for name in list(loaded) + [n for n in chosen if n not in loaded]:
            self._add_row(name, chosen.get(name), loaded=name in loaded)
        self.use_default.toggled.connect(lambda on: self.table.setEnabled(not on))
        self.use_default.setChecked(value is None)
        self.table.setEnabled(value is not None)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.use_default)
        layout.addWidget(self.table)

    def _add_row(self, name: str, scale: float | None, loaded: bool) -> None:
        row = self.table.rowCount()
        self.table.insertRow(row)
        item = QTableWidgetItem(name if loaded else f"{name} (not loaded)")
        item.setData(Qt.ItemDataRole.UserRole, name)
        item.setFlags(Qt.ItemFlag.ItemIsEnabled | Qt.ItemFlag.ItemIsUserCheckable)
        item.setCheckState(Qt.CheckState.Checked if scale is not None else Qt.CheckState.Unchecked)
        self.table.setItem(row, 0, item)
        spin = QDoubleSpinBox()
        spin.setRange(-4.0, 4.0)
        spin.setSingleStep(0.05)
        spin.setValue(1.0 if scale is None else float(scale))
        self.table.setCellWidget(row, 1, spin)
        guard_wheel(spin)  # the table scrolls under the pointer, not the scale

    def names(self) -> list[str]:
        return [self.table.item(r, 0).data(Qt.ItemDataRole.UserRole) for r in range(self.table.rowCount())]

    def set_value(self, value: tuple[tuple[str, float], ...] | None) -> None:
        chosen = dict(value or ())
        self.use_default.setChecked(value is None)
        for row, name in enumerate(self.names()):
            on = name in chosen
            self.table.item(row, 0).setCheckState(Qt.CheckState.Checked if on else Qt.CheckState.Unchecked)
            self.table.cellWidget(row, 1).setValue(float(chosen.get(name, 1.0)))

    def value(self) -> tuple[tuple[str, float], ...] | None:
        """None: the default set; else the checked adapters and scales, in list order."""
        if self.use_default.isChecked():
            return None
        return tuple((name, round(self.table.cellWidget(row, 1).value(), 4)) for row, name in enumerate(self.names())
                     if self.table.item(row, 0).checkState() == Qt.CheckState.Checked)
