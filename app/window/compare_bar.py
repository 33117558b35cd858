"""Compare mode: type once, send to every chosen pane of the tile set, then keep going with the winner.

Each pane stays its own chat with its own settings (sampler preset, LoRA set, pinned documents) and,
where a second model is loaded beside the main one, its own model. Panes on the same model and adapters
whose prompts are the same up to the new message (same system prompt, documents and history) share
that prefix's cache pages: the first of them is sent at once and the others when its prompt has been
read (its reply starts streaming), so the shared pages are computed once and the others find them
cached (their replies report them as cached tokens; the page map hatches them as shared).

Picking a winner: "Continue in this one" closes the other panes (their chats stay in the list) and
leaves compare mode; "Branch the others from it" replaces each other pane's chat with a branch of the
winner's chat (so every pane continues from the winning reply), keeping that pane's own settings.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QCheckBox, QComboBox, QFileDialog, QGridLayout, QHBoxLayout, QLabel, QPushButton, QSizePolicy, QVBoxLayout, QWidget,
)

from app.chat.chat_pane import ChatPane, PromptEdit
from app.chat.pane_widgets import ElidedLabel, activity_icon
from app.core.formatting import NO_LORA
from app.core.presets import BUILTIN_PRESETS, matching_preset
from app.core.tasks import spawn

LOAD_ANOTHER = "Load another model…"


_PLACES = {2: ("left", "right"), 3: ("left", "middle", "right"),
           4: ("top left", "top right", "bottom left", "bottom right")}


def tile_place(n: int, count: int) -> str:
    """Where the n-th of `count` tiles sits, in words (window_layout.grid's order: a row of up to three, or two
    rows of two)."""
    places = _PLACES.get(count)
    return places[n] if places else f"tile {n + 1}"


class CompareBar(QWidget):
    """The bar under the tiles in compare mode (see the module docstring)."""

    def __init__(self, area: Any, parent: QWidget | None = None):
        super().__init__(parent)
        self.area = area  # the ChatArea that owns this bar (its tiles, chats and store)
        self.service: Any = None  # the local engine (models beside the main one), set by the window
        self.panes: list[ChatPane] = []
        self.checks: dict[int, QCheckBox] = {}  # chat id -> its "send to it" box
        self.model_boxes: dict[int, QComboBox] = {}
        self.summaries: dict[int, ElidedLabel] = {}  # chat id -> its preset and adapters
        self._followed: set[int] = set()  # sessions whose settings changes refresh the chips
        self.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Maximum)
        self.chips = QGridLayout()
        self.chips.setContentsMargins(0, 0, 0, 0)
        self.prompt = PromptEdit()
        self.prompt.setPlaceholderText("Compare: one message to every ticked pane (Enter sends)")
        self.prompt.setMaximumHeight(60)
        self.prompt.setAccessibleName("Compare: message to every ticked pane")
        self.prompt.setAccessibleDescription("Enter sends to every ticked pane; Shift+Enter starts a new line")
        self.send_btn = QPushButton("Send to all")
        self.pin_btn = QPushButton("Pin document…")
        self.pin_btn.setToolTip("Pin a text or PDF document to every ticked pane's chat (a shared prefix)")
        self.winner = QComboBox()
        self.winner.setAccessibleName("Winner")
        self.continue_btn = QPushButton("Continue in this one")
        self.branch_btn = QPushButton("Branch the others from it")
        self.message = ElidedLabel()
        self.message.setStyleSheet("color: #c0392b")
        send_row = QHBoxLayout()
        send_row.addWidget(self.prompt, 1)
        send_row.addWidget(self.send_btn)
        send_row.addWidget(self.pin_btn)
        win_row = QHBoxLayout()
        win_row.addWidget(QLabel("Winner:"))
        win_row.addWidget(self.winner, 1)
        win_row.addWidget(self.continue_btn)
        win_row.addWidget(self.branch_btn)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(4, 2, 4, 2)
        layout.addLayout(self.chips)
        layout.addLayout(send_row)
        layout.addLayout(win_row)
        layout.addWidget(self.message)
        self.prompt.submitted.connect(self.send_typed)
        self.send_btn.clicked.connect(self.send_typed)
        self.pin_btn.clicked.connect(self.pick_document)
        self.continue_btn.clicked.connect(lambda: self.continue_in(self.winner_pane()))
        self.branch_btn.clicked.connect(lambda: self.branch_from(self.winner_pane()))

    # --- panes -------------------------------------------------------------------------------------

    def set_panes(self, panes: list[ChatPane]) -> None:
        """The tiles shown now: one chip (tick + model) each, ticked unless unticked before."""
        was = {cid: box.isChecked() for cid, box in self.checks.items()}
        while (item := self.chips.takeAt(0)) is not None:
            if item.widget() is not None:
                item.widget().deleteLater()
        self.panes, self.checks, self.model_boxes, self.summaries = list(panes), {}, {}, {}
        columns = 2 if len(panes) == 4 else max(1, len(panes))
        for n, pane in enumerate(panes):
            cid = pane.session.chat_id
            check = NameCheck(pane.session.chat.title)
            check.setChecked(was.get(cid, True))
            check.setStyleSheet(f"QCheckBox {{ color: rgb{tuple(pane.swatch.colour()[:3])}; font-weight: bold }}")
            check.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Fixed)
            models = QComboBox()
            models.setAccessibleName(f"Model for {pane.session.chat.title}")
            models.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Fixed)
            self._fill_models(models, pane)
            models.activated.connect(lambda _i, p=pane, box=models: self._model_picked(p, box))
            chip = QWidget()  # the name on its own line (as wide as the tile), its settings and model under it
            rows = QVBoxLayout(chip)
            rows.setContentsMargins(0, 0, 0, 0)
            rows.setSpacing(0)
            rows.addWidget(check)
            line = QHBoxLayout()
            rows.addLayout(line)
            self.summaries[cid] = summary = ElidedLabel(settings_summary(pane.session.settings))
            line.addWidget(summary, 1)
            if cid not in self._followed:  # (once per session: the chips are rebuilt with the tiles)
                self._followed.add(cid)
                pane.session.settings_changed.connect(self.refresh_models)
            line.addWidget(models, 1)
            self.chips.addWidget(chip, n // columns, n % columns)
            self.checks[cid], self.model_boxes[cid] = check, models
        self.winner.clear()
        for pane in panes:
            self.winner.addItem(activity_icon("", pane.swatch.colour()), "", pane.session.chat_id)
        self._name_winners()

    def rename(self, chat_id: int, title: str) -> None:
        """A compared chat's new title (renamed, or titled by its first message): its chip and winner entry."""
        check = self.checks.get(chat_id)
        if check is not None:
            check.set_name(title)
        self._name_winners()

    def _name_winners(self) -> None:
        """Each winner entry is its chat's title, with the tile's place where titles repeat (four panes sent the
        same first message are all titled by it; the entry's colour square alone says nothing to a screen
        reader)."""
        titles = [pane.session.chat.title for pane in self.panes]
        for n, (pane, title) in enumerate(zip(self.panes, titles)):
            index = self.winner.findData(pane.session.chat_id)
            if index >= 0:
                repeated = titles.count(title) > 1
                self.winner.setItemText(index, f"{title} ({tile_place(n, len(titles))})" if repeated else title)

    def refresh_models(self, _models=None) -> None:
        """Every chip's model list and settings summary, as they are now."""
        for pane in self.panes:
            box = self.model_boxes.get(pane.session.chat_id)
            if box is not None:
                self._fill_models(box, pane)
                self.summaries[pane.session.chat_id].setText(settings_summary(pane.session.settings))

    def _fill_models(self, box: QComboBox, pane: ChatPane) -> None:
        box.clear()
        if self.service is None or self.area.backend.current is not self.service:
            box.addItem("the server's model", None)
            box.setEnabled(False)
            return
        box.setEnabled(True)
        for path, name in self.service.models():
            box.addItem(name if path is not None else f"{name} (main)", path)
        want = pane.session.settings.model
        index = box.findData(want)
        if want is not None and index < 0:  # named, but not loaded (any more): shown so the user sees it
            box.addItem(f"{want} (not loaded)", want)
            index = box.count() - 1
        box.setCurrentIndex(max(index, 0))
        box.addItem(LOAD_ANOTHER, LOAD_ANOTHER)

    def _model_picked(self, pane: ChatPane, box: QComboBox) -> None:
        data = box.currentData()
        if data == LOAD_ANOTHER:
            self._fill_models(box, pane)
            path = QFileDialog.getExistingDirectory(self, "Load a model beside the main one")
            if path:
                self.load_beside(path, pane)
            return
        self.use_model(pane, data)

    def use_model(self, pane: ChatPane, path: str | None) -> None:
        """This pane's chat runs on `path` (a model loaded beside the main one; None: the main model)."""
        pane.session.set_settings(replace(pane.session.settings, model=path))
        self.refresh_models()

    def load_beside(self, path: str, pane: ChatPane | None = None, cache_tokens: int | None = None):
        """Load a model beside the main one (the fit check guards both; its cache as big as the main
        model's unless given); the pane, if given, then uses it. A refusal shows in the bar."""
        async def load() -> None:
            errors: list[str] = []
            self.service.load_failed.connect(errors.append)
            try:
                ok = await self.service.load_beside(path, cache_tokens)
            finally:
                self.service.load_failed.disconnect(errors.append)
            self.show_message("" if ok else errors[-1] if errors else f"could not load {path}")
            if ok and pane is not None:
                self.use_model(pane, path)
        return spawn(load(), self.show_message)

    def chosen(self) -> list[ChatPane]:
        return [p for p in self.panes if self.checks[p.session.chat_id].isChecked()]

    def winner_pane(self) -> ChatPane | None:
        cid = self.winner.currentData()
        return next((p for p in self.panes if p.session.chat_id == cid), None)

    def show_message(self, text: str) -> None:
        self.message.setText(text)
        self.message.setVisible(bool(text))

    # --- sending -----------------------------------------------------------------------------------

    def send_typed(self) -> None:
        text = self.prompt.toPlainText()
        if text.strip():
            self.prompt.clear()
            self.send(text)

    def send(self, text: str, panes: list[ChatPane] | None = None) -> list[ChatPane]:
        """Send `text` to every ticked pane, or to `panes` (queued in those still replying); returns them.
        Panes whose prompts match up to it go one after the other (see the module docstring)."""
        self.show_message("")
        panes = self.chosen() if panes is None else panes
        if not panes:
            self.show_message("Tick at least one pane to send to.")
            return []
        keys = [(_prefix_key(p), p.session.running) for p in panes]  # before anything is sent
        leaders: dict[tuple, ChatPane] = {}
        for pane, (key, busy) in zip(panes, keys):
            if busy:
                self._submit(pane, text)  # queued behind its own reply
            elif key not in leaders:
                leaders[key] = pane
                self._submit(pane, text)
            else:  # once the leader's prompt is read, so the shared pages are computed once
                _after_prompt_read(leaders[key], lambda p=pane: self._submit(p, text))
        return panes

    def _submit(self, pane: ChatPane, text: str) -> None:
        try:
            pane.session.submit(text)
        except Exception as exc:  # noqa: BLE001 - shown in the bar and the pane; the other panes still get it
            self.show_message(f"{pane.session.chat.title}: {exc}")
            pane._show_error(str(exc))

    def pick_document(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Pin a document to the ticked panes", "",
                                              "Documents (*.txt *.md *.pdf);;All files (*)")
        if path:
            self.pin_document(path)

    def pin_document(self, path: str) -> int:
        """Pin one document to every ticked pane's chat; returns how many took it."""
        pinned = sum(pane.pin_document(path) for pane in self.chosen())
        errors = [p.error.text() for p in self.chosen() if p.error.isVisible()]
        self.show_message(errors[0] if errors else "")
        return pinned

    # --- the winner --------------------------------------------------------------------------------

    def continue_in(self, winner: ChatPane | None) -> None:
        """Keep only the winner: the other compared panes close (their chats stay in the list)."""
        if winner is None:
            return
        for pane in list(self.panes):
            if pane is not winner:
                self.area.close_chat(pane.session.chat_id)
        self.area.set_compare(False)
        self.area.set_view("tabs")
        self.area.open_chat(winner.session.chat_id)

    def branch_from(self, winner: ChatPane | None) -> list[int]:
        """Every other compared pane continues from the winner: its chat is replaced (in the tile) by a
        branch of the winner's chat, with that pane's own settings; returns the new chats' ids."""
        if winner is None or not winner.session.messages:
            return []
        if winner.session.running:
            self.show_message("The winner is still replying: wait for it (or stop it) before branching.")
            return []
        last = winner.session.messages[-1].id
        made = []
        for pane in list(self.panes):
            if pane is winner:
                continue
            chat_id = winner.session.branch(last)
            title = f"{pane.session.chat.title} ← {winner.session.chat.title}"
            self.area.store.rename_chat(chat_id, title)
            self.area.store.set_settings(chat_id, pane.session.settings)
            self.area.close_chat(pane.session.chat_id)
            self.area.open_chat(chat_id)
            made.append(chat_id)
        self.area.chat_list.refresh()
        self.area.open_chat(winner.session.chat_id)
        self.area.show_side_by_side([winner] + [self.area.panes[c] for c in made])
        return made


class NameCheck(QCheckBox):
    """A compared chat's tick box, named after the chat: the name elided in the middle to the chip's width
    (its start and end tell chats apart better than its start alone), the whole name in its tooltip and
    accessible name."""

    def __init__(self, name: str, parent: QWidget | None = None):
        super().__init__(parent)
        self._name = ""
        self.set_name(name)

    def name(self) -> str:
        return self._name

    def set_name(self, name: str) -> None:
        self._name = name
        self.setToolTip(name)
        self.setAccessibleName(f"Send to {name}")
        self._elide()

    def resizeEvent(self, event) -> None:  # noqa: N802
        super().resizeEvent(event)
        self._elide()

    def _elide(self) -> None:
        indicator = self.style().pixelMetric(self.style().PixelMetric.PM_IndicatorWidth, None, self)
        spacing = self.style().pixelMetric(self.style().PixelMetric.PM_CheckBoxLabelSpacing, None, self)
        room = max(0, self.width() - indicator - spacing - 4)
        self.setText(self.fontMetrics().elidedText(self._name, Qt.TextElideMode.ElideMiddle, room))


def settings_summary(settings) -> str:
    """What sets a pane apart at a glance: its sampler preset (or temperature) and its adapters."""
    preset = matching_preset(settings, BUILTIN_PRESETS) or f"T={settings.temperature:g}"
    loras = ("LoRA " + ", ".join(name for name, _ in settings.loras) if settings.loras
             else NO_LORA if settings.loras == () else "default LoRA set")
    return f"{preset} · {loras}"


def _prefix_key(pane: ChatPane) -> tuple:
    """Equal for panes whose prompts match up to the new message: model, adapters, documents + system
    prompt, history."""
    s = pane.session.prompt_settings()
    return s.model, s.loras, s.system_prompt, tuple((m.role, m.content) for m in pane.session.messages)


def _after_prompt_read(leader: ChatPane, then) -> None:
    """Call `then` once the leader's reply streams (its prompt's pages are written) or has ended."""
    session = leader.session

    def check(state: str) -> None:
        if state in ("streaming", ""):
            session.activity_changed.disconnect(check)
            then()
    session.activity_changed.connect(check)
