"""Crash recovery: a separate process streams a reply into the store and is killed with SIGKILL.

The child runs the app's real path (EngineService + ChatSession on a qasync loop, tiny model) and
prints every text delta with a timestamp. After the kill, the reopened history must hold every
completed message, and the partial reply must be a prefix of what was streamed that includes
everything streamed more than one second before the kill.
"""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from app.core.store import Store

pytestmark = pytest.mark.timeout(240)
REPO = Path(__file__).resolve().parents[2]

CHILD = r"""
import asyncio, json, sys, time
from PySide6.QtCore import QCoreApplication
from app.chat.chat_session import ChatSession
from app.core.store import ChatSettings, Store
from app.local.engine_service import EngineService
from app.window.event_loop import QtEventLoop

model, data_dir = sys.argv[1], sys.argv[2]
app = QCoreApplication([])
loop = QtEventLoop(app)
asyncio.set_event_loop(loop)

def say(**kw):
    print(json.dumps(dict(t=time.time(), **kw)), flush=True)

async def main():
    store = Store.open(data_dir)
    service = EngineService()
    assert await service.load({"path": model, "cache_tokens": 8192})
    chat = store.create_chat("crash test", ChatSettings(max_new_tokens=16, seed=1))
    session = ChatSession(store, chat.id, service)
    await session.send("first question")
    say(phase="done", id=session.messages[-1].id, text=session.messages[-1].content)
    session.set_settings(ChatSettings(max_new_tokens=6000, seed=2))
    seen = {}
    def changed(mid):
        live = session.live(mid)
        if live and len(live[0]) > seen.get(mid, 0):
            say(phase="delta", id=mid, delta=live[0][seen.get(mid, 0):])
            seen[mid] = len(live[0])
    session.reply_changed.connect(changed)
    for k in range(20):  # a random model may hit a stop token early: then the next reply streams
        await session.send(f"question {k}")
        say(phase="done", id=session.messages[-1].id, text=session.messages[-1].content)

with loop:
    loop.run_until_complete(main())
"""


@pytest.fixture(scope="module")
def long_tiny_model(tmp_path_factory):
    from tests.tiny_models import write_tiny_model

    return write_tiny_model(tmp_path_factory.mktemp("crash") / "tiny", max_position_embeddings=8192)


def test_kill_9_mid_stream_keeps_history_and_the_partial_reply(tmp_path, long_tiny_model):
    data = tmp_path / "data"
    env = dict(os.environ, PYTHONPATH=str(REPO), QT_QPA_PLATFORM="offscreen")
    proc = subprocess.Popen([sys.executable, "-c", CHILD, str(long_tiny_model), str(data)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=REPO)
    events, done, started = [], {}, {}
    try:
        for line in proc.stdout:
            e = json.loads(line)
            if e["phase"] == "done":
                done[e["id"]] = e["text"]
            else:
                events.append(e)
                started.setdefault(e["id"], e["t"])
                if e["t"] - started[e["id"]] > 2.0:
                    break
        else:
            pytest.fail(f"child exited early: {proc.stderr.read()[-3000:]}")
        os.kill(proc.pid, signal.SIGKILL)
        killed_at = time.time()
        proc.wait(30)
        events += [json.loads(line) for line in proc.stdout if '"delta"' in line]
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == -signal.SIGKILL

    store = Store.open(data)
    try:
        (chat,) = store.chats()
        msgs = store.messages(chat.id)
        n = len(msgs) // 2
        assert n >= 2 and [m.role for m in msgs] == ["user", "assistant"] * n
        assert [m.content for m in msgs[::2]] == ["first question"] + [f"question {k}" for k in range(n - 1)]
        for m in msgs[1:-1:2]:  # every completed reply, exactly as it was streamed
            assert m.stats.state == "done" and m.content == done[m.id]
        assert msgs[1].stats.new_tokens == 16
        partial = msgs[-1]
        assert partial.id not in done and store.recovered == [partial.id]
        streamed = "".join(e["delta"] for e in events if e["id"] == partial.id)
        must_have = "".join(e["delta"] for e in events if e["id"] == partial.id and e["t"] <= killed_at - 1.0)
        assert partial.stats.state == "interrupted" and 0 < partial.stats.new_tokens < 6000
        assert streamed.startswith(partial.content), "the saved reply is not what was streamed"
        assert len(partial.content) >= len(must_have) > 0, (
            f"lost more than a second: saved {len(partial.content)} chars, {len(must_have)} were streamed 1 s before the kill")
    finally:
        store.close()
