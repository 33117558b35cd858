"""A damaged, read-only, locked or full history database, with real SQLite files and real processes.

Oracles: a damaged file is moved aside byte for byte (never written) and a fresh history starts; a read-only
file keeps its bytes; a second pagedeck on the same folder is refused while the first lives and starts
once it is killed (kill -9 leaves no stale lock); a full database refuses the write with a message naming
the file, and everything committed before is still there after reopening.
"""
from __future__ import annotations

import hashlib
import os
import signal
import sqlite3
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import pytest

from app.core.instance_lock import AlreadyRunning, InstanceLock
from app.core.store import ReplyStats, Store
from app.core.store_errors import StoreWriteError
from app.core.store_open import DB_FILE, HistoryUnavailable, open_history

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(120)


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def history_with_a_chat(folder: Path) -> Path:
    opened = open_history(folder)
    chat = opened.store.create_chat("kept")
    opened.store.add_message(chat.id, "user", "hello " * 500)
    opened.store.close()
    opened.lock.release()
    return folder / DB_FILE


def close(opened) -> None:
    opened.store.close()
    opened.lock.release()


@pytest.mark.parametrize("damage", ["truncated", "random bytes", "zeroed header"])
def test_a_damaged_database_is_moved_aside_untouched_and_a_fresh_history_starts(tmp_path, damage):
    path = history_with_a_chat(tmp_path)
    data = path.read_bytes()
    bad = {"truncated": data[: len(data) // 2 + 7], "random bytes": os.urandom(len(data)),
           "zeroed header": bytes(100) + data[100:]}[damage]
    path.write_bytes(bad)
    opened = open_history(tmp_path)
    try:
        assert opened.moved_to is not None and opened.moved_to.read_bytes() == bad
        assert str(opened.moved_to) in opened.notice and "damaged" in opened.notice
        assert opened.store.chats() == []
        opened.store.create_chat("new")  # the fresh history works
    finally:
        close(opened)
    again = open_history(tmp_path)  # the second start finds a healthy file: no notice, nothing moved
    try:
        assert again.notice is None and [c.title for c in again.store.chats()] == ["new"]
        assert opened.moved_to.read_bytes() == bad
    finally:
        close(again)


@contextmanager
def read_only(path: Path):
    """Really unwritable: mode 0444, and for root (whom modes don't stop) the immutable attribute."""
    mode = path.stat().st_mode
    os.chmod(path, 0o444)
    immutable = os.geteuid() == 0
    if immutable and subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode != 0:
        os.chmod(path, mode)
        pytest.skip("running as root where chattr +i is not available: no way to make a file read-only for root")
    try:
        yield
    finally:
        if immutable:
            subprocess.run(["chattr", "-i", str(path)], check=True)
        os.chmod(path, mode)


def test_a_read_only_database_is_left_as_it_is_and_the_session_runs_elsewhere(tmp_path):
    path = history_with_a_chat(tmp_path)
    before = digest(path)
    with read_only(path):
        opened = open_history(tmp_path)
        try:
            assert opened.store.path.parent != tmp_path and "can't be written" in opened.notice
            assert str(path) in opened.notice and str(opened.store.path.parent) in opened.notice
            chat = opened.store.create_chat("this session")
            opened.store.add_message(chat.id, "user", "saved in the temporary history")
        finally:
            close(opened)
        assert digest(path) == before


HOLDER = ("import sys; from app.core.instance_lock import InstanceLock; InstanceLock(sys.argv[1]).acquire(); "
          "print('held', flush=True); sys.stdin.read()")


def hold_lock(folder: Path) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(folder)], cwd=ROOT, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_second_instance_is_refused_while_the_first_lives_and_a_kill_9_leaves_no_stale_lock(tmp_path):
    holder = hold_lock(tmp_path)
    try:
        with pytest.raises(AlreadyRunning) as refused:
            open_history(tmp_path)
        assert str(tmp_path) in str(refused.value) and f"process {holder.pid}" in str(refused.value)
        assert not (tmp_path / DB_FILE).exists()  # refused before SQLite was touched
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(30)
    assert (tmp_path / "pagedeck.lock").exists()  # left behind by the killed process, and yet:
    opened = open_history(tmp_path)
    close(opened)


def test_the_app_itself_refuses_to_start_on_a_folder_in_use(tmp_path):
    holder = hold_lock(tmp_path)
    try:
        out = subprocess.run([sys.executable, "-m", "app", "--data-dir", str(tmp_path)], cwd=ROOT,
                             capture_output=True, text=True, timeout=90,
                             env={**os.environ, "PYTHONPATH": str(ROOT), "QT_QPA_PLATFORM": "offscreen"})
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(30)
    assert out.returncode == 1, out.stderr[-3000:]
    assert "already running with the data folder" in out.stderr and str(tmp_path) in out.stderr


def test_a_database_locked_by_another_program_is_refused_not_touched(tmp_path):
    path = history_with_a_chat(tmp_path)
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("PRAGMA locking_mode=EXCLUSIVE")  # after its first write it keeps the file to itself
    other.execute("BEGIN EXCLUSIVE")
    other.execute("UPDATE chats SET title='theirs'")
    other.execute("COMMIT")
    try:
        with pytest.raises(HistoryUnavailable, match="locked by another program"):
            open_history(tmp_path)
        InstanceLock(tmp_path).acquire().release()  # the refused open let go of the folder
    finally:
        other.close()
    assert not list(tmp_path.glob("*.damaged-*"))
    opened = open_history(tmp_path)  # once the other program let go: its commit is there
    try:
        assert [c.title for c in opened.store.chats()] == ["theirs"]
    finally:
        close(opened)


def test_a_full_database_refuses_the_write_says_so_and_keeps_every_earlier_commit(tmp_path):
    store = Store.open(tmp_path)
    chat = store.create_chat("full disk")
    reply = store.add_message(chat.id, "assistant", "", ReplyStats(state="streaming"))
    store.update_reply(reply.id, "committed part", ReplyStats(state="streaming"))
    told = []
    store.write_failed.append(told.append)
    pages = store._db.execute("PRAGMA page_count").fetchone()[0]
    store._db.execute(f"PRAGMA max_page_count={pages}")  # SQLite's own SQLITE_FULL once the file must grow
    with pytest.raises(StoreWriteError) as full:
        store.update_reply(reply.id, "committed part" + "x" * 200_000, ReplyStats(state="streaming"))
    assert "full" in str(full.value) and str(store.path) in str(full.value) and told == [full.value]
    assert store.message(reply.id).content == "committed part"  # rolled back, the connection still usable
    store.close()
    reopened = Store.open(tmp_path)
    try:
        assert reopened.message(reply.id).content == "committed part"
        assert reopened.integrity() == "ok"
    finally:
        reopened.close()


def test_the_window_says_what_happened_to_the_history(tmp_path, qtbot):
    from app.window.main_window import MainWindow

    path = history_with_a_chat(tmp_path)
    path.write_bytes(b"SQLite format 3\x00" + os.urandom(4000))
    win = MainWindow(data_dir=tmp_path)
    qtbot.addWidget(win)
    win.show()
    try:
        # the damaged file, not its -wal / -shm companions moved beside it (the directory's order varies)
        moved = next(p for p in tmp_path.glob(f"{DB_FILE}.damaged-*") if not p.name.endswith(("-wal", "-shm")))
        assert win.store_notice.isVisible() and str(moved) in win.store_notice.text
        win.store_notice.hide()
        pages = win.store._db.execute("PRAGMA page_count").fetchone()[0]
        win.store._db.execute(f"PRAGMA max_page_count={pages}")
        with pytest.raises(StoreWriteError):
            chat = win.store.create_chat("x")
            win.store.update_replies({win.store.add_message(chat.id, "user", "y" * 100_000).id:
                                      ("z" * 100_000, ReplyStats(state="streaming"))})
        assert win.store_notice.isVisible() and "full" in win.store_notice.text
    finally:
        win.store.close()
        win.instance_lock.release()
