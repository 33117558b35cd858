"""Fixtures every app test gets."""
from __future__ import annotations

import re
import traceback

import pytest

from app.core import tasks


class TaskFailures:
    """The background tasks (app.core.tasks.spawn) that failed during a test. The app only logs such a failure
    and shows it to the user, so a test would pass over it; here each one fails the test unless the test said
    it expects it (`expect`)."""

    def __init__(self) -> None:
        self.seen: list[BaseException] = []
        self._expected: list[tuple[type[BaseException], str]] = []

    def expect(self, kind: type[BaseException], match: str = "") -> None:
        """A failure of this type whose message matches `match` (re.search) is what the test provokes."""
        self._expected.append((kind, match))

    def unexpected(self) -> list[BaseException]:
        return [e for e in self.seen
                if not any(isinstance(e, kind) and re.search(match, str(e)) for kind, match in self._expected)]


@pytest.fixture(autouse=True)
def task_failures():
    """Fails the test (at its teardown) when a spawned background task raised and the test did not expect it."""
    failures = TaskFailures()
    stop = tasks.watch_failures(lambda _task, exc: failures.seen.append(exc))
    try:
        yield failures
    finally:
        stop()
    unexpected = failures.unexpected()
    if unexpected:
        told = "\n".join("".join(traceback.format_exception(e)) for e in unexpected)
        pytest.fail(f"{len(unexpected)} background task(s) failed during the test:\n{told}", pytrace=False)
