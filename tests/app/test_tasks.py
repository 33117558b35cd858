"""app.core.tasks.spawn: a background task's failure is logged, shown through on_error and handed to the
watchers; under this test suite (tests/app/conftest.py) it fails the test it happened in, unless expected."""
from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

from app.core import tasks

ROOT = Path(__file__).resolve().parents[2]


async def _boom(message: str) -> None:
    await asyncio.sleep(0)
    raise ValueError(message)


def test_a_failed_task_is_logged_shown_and_watched(caplog, task_failures):
    task_failures.expect(ValueError, "^boom$")
    shown, watched = [], []
    stop = tasks.watch_failures(lambda task, exc: watched.append((task, exc)))

    async def body():
        task = tasks.spawn(_boom("boom"), shown.append)
        fine = tasks.spawn(asyncio.sleep(0), shown.append)
        await asyncio.wait([task, fine])
        await asyncio.sleep(0)  # the done callbacks run on the loop's next turn
        return task

    loop = asyncio.new_event_loop()
    try:
        task = loop.run_until_complete(body())
    finally:
        stop()
        loop.close()
    assert shown == ["ValueError: boom"]
    assert [(t, str(e)) for t, e in watched] == [(task, "boom")]
    assert "background task failed: boom" in caplog.text
    assert [str(e) for e in task_failures.seen] == ["boom"]


INNER = '''
import asyncio

from app.core.tasks import spawn


async def boom():
    raise RuntimeError("{message}")


def test_inner(task_failures):
    {expect}
    async def body():
        spawn(boom(), lambda text: None)  # shown to the user and nothing else: the test itself sees nothing
        await asyncio.sleep(0.01)
    loop = asyncio.new_event_loop()
    loop.run_until_complete(body())
    loop.close()
'''


def _inner(tmp_path, expect: str) -> subprocess.CompletedProcess:
    test = tmp_path / "test_inner.py"
    test.write_text(INNER.format(message="hidden failure", expect=expect))
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.app.conftest",
                           "--rootdir", str(tmp_path), str(test)], capture_output=True, text=True, cwd=ROOT,
                          timeout=120)


def test_a_test_during_which_a_task_failed_fails(tmp_path):
    run = _inner(tmp_path, "pass")
    assert run.returncode == 1, run.stdout + run.stderr
    assert "1 background task(s) failed during the test" in run.stdout
    assert "RuntimeError: hidden failure" in run.stdout


def test_an_expected_failure_passes(tmp_path):
    run = _inner(tmp_path, 'task_failures.expect(RuntimeError, "hidden")')
    assert run.returncode == 0 and "1 passed" in run.stdout, run.stdout + run.stderr
