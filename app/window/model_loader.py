"""Loading a model into the local generator from the window: what to load first, asking before a load
stops running replies, and waiting for the first load.

The first request is the command line's model, else the last session's (if it is still on disk). A load
while replies run asks first (stop them and load now, load when they have finished, or cancel), in a
window-modal box so that the replies keep streaming while it is open.
"""
from __future__ import annotations

import asyncio
import sys

from PySide6.QtCore import QObject, Signal
from PySide6.QtWidgets import QMessageBox, QWidget

from app.core.state import AppState
from app.core.tasks import spawn
from app.local.engine_service import EngineService
from app.local.model_build import COMPILING
from app.window.status import StatusLine
from engine.contract import model_path_problem


class ModelLoader(QObject):
    cancelled = Signal()  # the user cancelled a load in the box that asked before it (the panel stops waiting)

    def __init__(self, service: EngineService, status: StatusLine, state: AppState, asked: dict, parent: QWidget):
        super().__init__(parent)
        self.service, self.status, self.state = service, status, state
        self.load_request = first_request(state, asked)
        self.load_question: QMessageBox | None = None  # asks before a load stops running replies
        self._load_task: asyncio.Task | None = None
        service.load_progress.connect(status.show_progress)
        service.load_stage.connect(self._stage)
        service.loaded.connect(self._loaded)
        service.load_failed.connect(self.error)
        service.lora_failed.connect(self.error)

    def error(self, message: str) -> None:
        self.status.error(message, self.service.info)

    def load_model(self, request: dict | None = None, when_busy: str | None = None) -> asyncio.Task | None:
        """Load a model. While replies run, first ask (load_question): stop them and load now, load when they
        have finished, or cancel; when_busy ("stop" or "wait") answers in advance. None while asking."""
        request = request if request is not None else self.load_request
        busy = len(self.service.running)
        if busy and when_busy is None:
            self._ask_before_load(request, busy)
            return None
        if when_busy not in (None, "stop", "wait"):
            raise ValueError(f"when_busy must be 'stop' or 'wait', got {when_busy!r}")
        wait = bool(busy) and when_busy == "wait"
        if wait:
            self.status.message(f"The model loads when {_replies(busy)} finished; new replies wait for it")
        self._load_task = spawn(self.service.load(request, wait_for_replies=wait), self.error)
        return self._load_task

    def _ask_before_load(self, request: dict, busy: int) -> None:
        box = self.load_question = QMessageBox(QMessageBox.Icon.Question, "Load model",
                                               f"{_replies(busy).capitalize()} still running.", parent=self.parent())
        box.setInformativeText("Loading another model now stops them (their text so far is kept).")
        stop = box.addButton("Stop replies and load", QMessageBox.ButtonRole.DestructiveRole)
        wait = box.addButton("Load when they finish", QMessageBox.ButtonRole.AcceptRole)
        box.addButton(QMessageBox.StandardButton.Cancel)
        box.setDefaultButton(wait)

        def answered(button) -> None:
            self.load_question = None
            if button is stop or button is wait:
                self.load_model(request, "stop" if button is stop else "wait")
            else:
                self.cancelled.emit()

        box.buttonClicked.connect(answered)
        box.open()  # window-modal, and the event loop (replies streaming) keeps running

    async def ready(self) -> bool:
        """Wait for the first model load (started now if nobody started one); True if a model is up."""
        if self._load_task is None and self.service.generator is None:
            self.load_model()
        if self._load_task is not None:
            await asyncio.wait([self._load_task])
        return self.service.generator is not None

    def _stage(self, text: str) -> None:
        """A load's stage in the status bar; the first start's compile also on the terminal (a pipx user who
        started pagedeck from a shell sees why the first start is slow)."""
        self.status.show_stage(text)
        if text == COMPILING:
            print(f"pagedeck: {text}", file=sys.stderr, flush=True)

    def _loaded(self, info: dict) -> None:
        """A model is up (or the chats are back on it): label, remembered as the last model, a message."""
        self.status.show_model(self.service.info)
        if self.service.request is not None:
            self.state.save_last_model(self.service.request)
            self.state.sync()
        self.status.message(f"Loaded {info['name']} in {info.get('load_seconds', 0):.1f} s", 5000)

    def back_to_local(self) -> None:
        """The chats run on the local generator again (after remote mode): show it as a fresh load does."""
        if self.service.info is not None:
            self._loaded(self.service.info)
        else:
            self.status.show_model(None)


def first_request(state: AppState, asked: dict) -> dict:
    """What to load first: the command line's model, else the last session's (if still on disk)."""
    if asked.get("path"):
        return asked
    last = state.last_model() or {}
    if last.get("path") and model_path_problem(last["path"]) is not None:
        last = {}
    return {**last, **{k: v for k, v in asked.items() if v is not None}}


def _replies(n: int) -> str:
    return f"{n} repl{'y is' if n == 1 else 'ies are'}"
