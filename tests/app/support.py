"""Shared fixtures for the app tests (imported by the tests in tests/app; holds no tests itself).

App code runs on a qasync loop on the Qt thread, as in the real app: each test body is a coroutine
driven by `loop.run_until_complete`, polling with asyncio.sleep while the generator thread works.
"""
from __future__ import annotations

import asyncio
import time

import pytest

TINY_CACHE_TOKENS = 4096  # 16 pages of 256 tokens


@pytest.fixture(scope="session")
def tiny_model(tiny_llama_folder):
    return tiny_llama_folder


@pytest.fixture
def loop(qapp):
    from app.window.event_loop import QtEventLoop

    lp = QtEventLoop(qapp)
    asyncio.set_event_loop(lp)
    yield lp
    lp.close()
    asyncio.set_event_loop(None)


@pytest.fixture
def store(tmp_path):
    from app.core.store import Store

    s = Store.open(tmp_path / "data")
    yield s
    s.close()


def make_window(qtbot, store, service=None):
    from app.window.main_window import MainWindow

    win = MainWindow(store, service)
    qtbot.addWidget(win)
    win.show()
    return win


def visible_panes(window) -> list:
    """The window's chat panes shown now (tabs: the current one; tiles: those tiled)."""
    return [p for p in window.chats.panes.values() if p.isVisible()]


def run(loop, coro, timeout: float = 120.0):
    return loop.run_until_complete(asyncio.wait_for(coro, timeout))


async def wait_until(predicate, timeout: float = 60.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(0.01)


async def loaded_service(model_path, cache_tokens: int = TINY_CACHE_TOKENS):
    from app.local.engine_service import EngineService

    service = EngineService()
    errors = []
    service.load_failed.connect(errors.append)
    assert await service.load({"path": str(model_path), "cache_tokens": cache_tokens}), errors
    return service
