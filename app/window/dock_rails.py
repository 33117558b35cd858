"""Side panels collapse to icon rails when the window is short of width.

Each side of the window (the chat list on the left, the engine panels on the right) has a rail: a narrow
toolbar with one icon button per panel of that side, shown while the side is collapsed. Collapsing hides the
side's panels; a rail button (a tooltip and an accessible name say which panel, Tab reaches it) reopens the
side with that panel in front and the keyboard focus in it, as do the View > Panels commands (Alt+1...).

A side collapses by itself while the window is narrower than COLLAPSE_BELOW_EM average characters of the
app's font (so a 200 % font collapses sooner: the chat area keeps its room). The user's own choice (View >
Panels > Collapse ..., or reopening a collapsed side) overrides that rule and is kept in the window's state
(app.window.window_state) with the panels a collapsed side reopens; "Collapse side panels automatically"
hands both sides back to the rule.
"""
from __future__ import annotations

from PySide6.QtCore import QEvent, QObject, QSize, Qt, QTimer
from PySide6.QtGui import QAction, QFontMetrics
from PySide6.QtWidgets import QDockWidget, QMainWindow, QTabBar, QToolBar, QToolButton

from app.preferences.design_tokens import ICON
from app.preferences.icons import icon
from app.window.menus import show_dock
from app.window.window_state import WindowState

AUTO, RAIL, OPEN = "auto", "rail", "open"  # a side's choice: the width rule, always collapsed, always open
CHOICES = (AUTO, RAIL, OPEN)
SIDES = ("left", "right")
# A side collapses while the window is narrower than this many average characters (about 750 and 600 px at
# a 9 pt font, 1500 and 1200 at twice that): the right side's engine panels first, then the chat list.
COLLAPSE_BELOW_EM = {"left": 100, "right": 125}
AREAS = {"left": Qt.DockWidgetArea.LeftDockWidgetArea, "right": Qt.DockWidgetArea.RightDockWidgetArea}
RAIL_AREAS = {"left": Qt.ToolBarArea.LeftToolBarArea, "right": Qt.ToolBarArea.RightToolBarArea}
ICONS = {"Chats": "chats", "DashboardDock": "dashboard", "Model": "model", "LoRA": "lora", "Discover": "discover",
         "Server": "server", "Batch": "batch"}  # dock object name -> icon; others get the presets icon


class SideRail:
    """One side: its rail (a vertical toolbar of icon buttons) and whether its panels are collapsed."""

    def __init__(self, window: QMainWindow, side: str, choice: str, reopen: list[str]) -> None:
        self.window, self.side, self.choice = window, side, choice
        self.reopen = reopen  # the panels (object names) the side shows again when it opens
        self.front: list[str] = []  # of those, the ones in front of their tab column
        self.collapsed = False
        self.bar = QToolBar(f"{side.capitalize()} panels")
        self.bar.setObjectName(f"{side}-rail")
        self.bar.setAccessibleName(f"{side.capitalize()} panels, collapsed")
        self.bar.setMovable(False)
        self.bar.setFloatable(False)
        self.bar.setOrientation(Qt.Orientation.Vertical)
        self.bar.toggleViewAction().setVisible(False)  # shown by collapsing, not from the toolbar menu
        window.addToolBar(RAIL_AREAS[side], self.bar)
        self.bar.hide()
        self.buttons: dict[str, QToolButton] = {}

    def docks(self) -> list[QDockWidget]:
        """The panels docked on this side now (a floating one belongs to no side)."""
        docks = [d for d in self.window.findChildren(QDockWidget)
                 if self.window.dockWidgetArea(d) == AREAS[self.side] and not d.isFloating()]
        order = list(ICONS)  # the order of their tabs; a panel added later after them
        return sorted(docks, key=lambda d: order.index(d.objectName()) if d.objectName() in order else len(order))

    def fill(self, on_click) -> None:
        """One button per panel of the side, in the order of their tabs."""
        self.bar.clear()
        self.buttons.clear()
        for dock in self.docks():
            title = dock.windowTitle()
            button = QToolButton()
            button.setIcon(icon(ICONS.get(dock.objectName(), "presets")))
            side = max(ICON, button.fontMetrics().height())  # the icons grow with a large font, as the text does
            button.setIconSize(QSize(side, side))
            button.setAutoRaise(True)
            button.setToolTip(f"Show the {title} panel")
            button.setAccessibleName(f"Show the {title} panel")
            button.setFocusPolicy(Qt.FocusPolicy.TabFocus)
            button.clicked.connect(lambda _=False, d=dock: on_click(self, d))
            self.bar.addWidget(button)
            self.buttons[dock.objectName()] = button


class DockRails(QObject):
    """Both sides' rails and the rule that collapses them; `start` once the window's layout is restored."""

    def __init__(self, window: QMainWindow, state: WindowState) -> None:
        super().__init__(window)
        self.window, self.state = window, state
        self.sides = {side: SideRail(window, side, state.rail_choice(side, CHOICES), state.rail_docks(side))
                      for side in SIDES}
        self._busy = True  # hiding and showing docks ourselves: not the user opening a panel
        self._started = False
        self.collapse_actions: dict[str, QAction] = {}
        for side in SIDES:
            act = QAction(f"Collapse the {side} panels to a rail", window)
            act.setObjectName(f"collapse_{side}")
            act.setCheckable(True)
            act.setStatusTip(f"Show the {side} side's panels as a rail of icons (your choice is kept)")
            act.triggered.connect(lambda on, s=side: self.choose(s, RAIL if on else OPEN))
            self.collapse_actions[side] = act
        self.auto_action = QAction("Collapse side panels automatically when narrow", window)
        self.auto_action.setObjectName("collapse_auto")
        self.auto_action.setCheckable(True)
        self.auto_action.setStatusTip("Side panels become icon rails while the window is narrow")
        self.auto_action.triggered.connect(lambda _=False: [self.choose(s, AUTO) for s in SIDES])
        self.actions = [*self.collapse_actions.values(), self.auto_action]

    def start(self) -> None:
        """Apply the kept choices to the restored layout and follow the window's width from now on."""
        for dock in self.window.findChildren(QDockWidget):
            dock.visibilityChanged.connect(lambda shown, d=dock: self._dock_shown(d) if shown else None)
        for rail in self.sides.values():  # a side the last session ended collapsed starts so (refit may open it)
            rail.collapsed = bool(rail.reopen) or rail.choice == RAIL
            if rail.collapsed:
                rail.fill(self._open_from_rail)
                for dock in rail.docks():
                    dock.hide()
            rail.bar.setVisible(rail.collapsed)
        self._started, self._busy = True, False
        self.window.installEventFilter(self)
        self.refit()

    # ------------------------------------------------------------------------------------- the rule
    def threshold(self, side: str) -> int:
        """The window width (px) below which `side` collapses by itself, at the window's font."""
        return COLLAPSE_BELOW_EM[side] * QFontMetrics(self.window.font()).averageCharWidth()

    def _wants_open(self, rail: SideRail) -> bool:
        if rail.choice != AUTO:
            return rail.choice == OPEN
        return not self.window.isVisible() or self.window.width() >= self.threshold(rail.side)

    def refit(self) -> None:
        if not self._started:
            return
        for rail in self.sides.values():
            open_ = self._wants_open(rail)
            if open_ and rail.collapsed:
                self._expand(rail)
            elif not open_ and not rail.collapsed:
                self._collapse(rail)
        for bar in self.window.findChildren(QTabBar):  # the dock columns' tab bars, which Qt makes as it goes
            if bar.parent() is self.window and not bar.accessibleName():
                bar.setAccessibleName("Panel tabs")
        for side, act in self.collapse_actions.items():
            act.setChecked(self.sides[side].collapsed)
        self.auto_action.setChecked(all(r.choice == AUTO for r in self.sides.values()))

    def eventFilter(self, obj, event) -> bool:  # noqa: N802 (Qt naming)
        kind = event.type()
        if obj is self.window and kind in (QEvent.Type.Resize, QEvent.Type.FontChange):
            self.refit()
        elif obj is self.window and kind == QEvent.Type.Show:
            QTimer.singleShot(0, self.refit)  # once the first show has fitted the window to its screen
        return False

    # ------------------------------------------------------------------------------------- choices
    def choose(self, side: str, choice: str) -> None:
        """The user's choice for a side (AUTO, RAIL or OPEN), applied now and kept."""
        if choice not in CHOICES:
            raise ValueError(f"a side's rail choice is one of {', '.join(CHOICES)}, not {choice!r}")
        self.sides[side].choice = choice
        self.refit()
        self.save()

    def save(self) -> None:
        for side, rail in self.sides.items():
            self.state.save_rail(side, rail.choice, rail.reopen if rail.collapsed else [])

    def _open_from_rail(self, rail: SideRail, dock: QDockWidget) -> None:
        """A rail button: open its side (kept open) with that panel in front, the focus in it."""
        rail.choice = OPEN
        if dock.objectName() not in rail.reopen:
            rail.reopen.append(dock.objectName())
        self.refit()
        show_dock(dock)
        self.save()

    def _dock_shown(self, dock: QDockWidget) -> None:
        """A panel of a collapsed side shown by other means (View > Panels, Alt+N): the side opens."""
        if self._busy:
            return
        for rail in self.sides.values():
            if rail.collapsed and dock in rail.docks():
                QTimer.singleShot(0, lambda r=rail, d=dock: self._open_from_rail(r, d))

    # ------------------------------------------------------------------------------------- collapsing
    def _collapse(self, rail: SideRail) -> None:
        docks = rail.docks()
        rail.reopen = [d.objectName() for d in docks if not d.isHidden()]
        rail.front = [d.objectName() for d in _in_front(self.window, docks)]
        rail.fill(self._open_from_rail)
        self._busy = True
        try:
            for dock in docks:
                dock.hide()
            rail.bar.show()
        finally:
            self._busy = False
        rail.collapsed = True

    def _expand(self, rail: SideRail) -> None:
        names = {d.objectName(): d for d in rail.docks()}
        self._busy = True
        try:
            rail.bar.hide()
            for name in rail.reopen:
                if name in names:
                    names[name].show()
            for name in rail.front:  # the panels that were in front of their tab columns, in front again
                if name in names and name in rail.reopen:
                    names[name].raise_()
        finally:
            self._busy = False
        rail.collapsed = False
        rail.reopen, rail.front = [], []


def _in_front(window: QMainWindow, docks: list[QDockWidget]) -> list[QDockWidget]:
    """The open docks a user sees: each tab column's current tab, and docks alone in their place."""
    open_ = [d for d in docks if not d.isHidden()]
    by_title = {d.windowTitle(): d for d in open_}
    tabbed, current = set(), []
    for bar in window.findChildren(QTabBar):
        if bar.parent() is not window:
            continue
        titles = [bar.tabText(i) for i in range(bar.count())]
        if any(t in by_title for t in titles):
            tabbed.update(titles)
            if bar.currentIndex() >= 0 and bar.tabText(bar.currentIndex()) in by_title:
                current.append(by_title[bar.tabText(bar.currentIndex())])
    return current + [d for d in open_ if d.windowTitle() not in tabbed]
