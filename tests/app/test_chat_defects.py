"""Chat-pane regressions: sizes that never follow text, Stop's state, chat colours, autoscroll, context
overflow, export headers. Real widgets, real SQLite, the tiny model through the real EngineService."""
import json
import time
from datetime import datetime

import pytest
from PySide6.QtCore import Qt
from PySide6.QtGui import QTextCursor
from PySide6.QtWidgets import QApplication, QSplitter

from app.core.store import ChatSettings, ReplyStats
from tests.app.support import loaded_service, loop, make_window, run, store, tiny_model, wait_until  # noqa: F401

pytestmark = pytest.mark.timeout(300)

TITLE_48 = "Write a Python function that parses ISO-8601 dat"[:48]


def _grid(panes):
    outer = QSplitter(Qt.Orientation.Vertical)
    for pair in (panes[:2], panes[2:]):
        row = QSplitter(Qt.Orientation.Horizontal)
        for p in pair:
            row.addWidget(p)
        outer.addWidget(row)
    return outer


def test_nothing_in_a_pane_changes_the_minimum_size(qtbot, store):
    """4 tiles, 48-char titles, banners, errors and stats: the grid's minimum size never moves."""
    from app.chat.chat_pane import ChatPane, RenderScheduler
    from app.chat.chat_session import ChatSession
    from app.core.backend import BackendSwitch
    from app.local.engine_service import EngineService

    service = EngineService()
    scheduler = RenderScheduler()
    panes = [ChatPane(ChatSession(store, store.create_chat(f"c{i}").id, BackendSwitch(service)), scheduler)
             for i in range(4)]
    grid = _grid(panes)
    qtbot.addWidget(grid)
    grid.resize(1000, 700)
    grid.show()
    qtbot.waitExposed(grid)
    before = grid.minimumSizeHint()
    pane_before = [p.minimumSizeHint() for p in panes]
    for p in panes:
        p.session.rename(TITLE_48)
        p.update_header(ReplyStats(state="prefill", progress=0.5, prompt_tokens=123456, cached_tokens=65536))
        p.banner.setText("Editing a message: sending makes a new version of it; the old one stays as an alternative "
                         "(Esc cancels).")
        p.banner.show()
        p._show_error("ValueError: prompt (8905 tokens) + max_new_tokens (1024) exceeds max_seq_len (8192) "
                      "/a/very/long/path/without/any/spaces/" + "x" * 120)
    qtbot.wait(1)  # let the layouts settle (posted LayoutRequest events)
    assert [p.session.chat.title for p in panes] == [TITLE_48] * 4
    assert grid.minimumSizeHint() == before, "pane contents changed the grid's minimum size"
    assert [p.minimumSizeHint() for p in panes] == pane_before
    # Small enough that 2x2 tiles plus the docks fit a 1024-px-wide window.
    assert before.width() <= 2 * 300 + 10, before
    assert "…" in panes[0].title.shown() and panes[0].title.toolTip() == TITLE_48


def test_stop_is_disabled_once_a_reply_is_done_stopped_or_failed(qtbot, loop, store, tiny_model):
    async def body():
        window = make_window(qtbot, store)
        failed = window.new_chat("no model yet")
        failed.send("hello?")  # no model loaded: the reply fails
        await wait_until(lambda: failed.session.task.done(), what="the failing reply")
        await wait_until(lambda: failed.session.messages[-1].stats.state == "error")
        qtbot.waitUntil(lambda: not failed.stop_btn.isEnabled(), timeout=10_000)

        service = await loaded_service(tiny_model)
        pane = make_window(qtbot, store, service).new_chat("done")
        s = pane.session
        s.set_settings(ChatSettings(max_new_tokens=8, seed=1, system_prompt=""))
        pane.send("hello")
        assert pane.stop_btn.isEnabled()
        await wait_until(lambda: s.task.done(), what="the reply")
        assert s.messages[-1].stats.state == "done"
        qtbot.waitUntil(lambda: not pane.stop_btn.isEnabled(), timeout=10_000)

        s.set_settings(ChatSettings(max_new_tokens=400, seed=1, system_prompt=""))
        pane.send("go on")
        await wait_until(lambda: s.live(s.messages[-1].id) and s.live(s.messages[-1].id)[1].new_tokens >= 2,
                         what="streaming")
        assert pane.stop_btn.isEnabled()
        pane.stop_btn.click()
        await wait_until(lambda: not s.running and s.task.done(), what="the stop")
        assert s.messages[-1].stats.state == "stopped"
        qtbot.waitUntil(lambda: not pane.stop_btn.isEnabled(), timeout=10_000)
        await service.close()

    run(loop, body())


def test_each_pane_shows_its_chat_colour_and_the_map_names_the_chat(qtbot, store):
    """11 open chats: 11 different colours, the same on each pane's swatch and on the page map, even when
    their job serials collide modulo the palette (the old map coloured by serial), and hover names the chat."""
    from app.core.chat_colours import CHAT_COLOURS

    win = make_window(qtbot, store)
    panes = [win.new_chat(f"chat number {i}") for i in range(11)]
    colours = [p.swatch.colour() for p in panes]
    assert colours == [CHAT_COLOURS.colour(p.session.chat_id) for p in panes]
    assert len(set(colours)) == 11, "two open chats share a colour"
    win.chats.set_view("tiles", 4)
    assert all(p.swatch.isVisibleTo(p) for p in panes)

    serials = [16 * i for i in range(11)]  # all equal modulo the 16-colour palette
    states = [s for s in serials for _ in range(2)] + [-2] * 10
    owners = {s: p.session.chat_id for s, p in zip(serials, panes)}
    page_map = win.dashboard.page_map
    page_map.update_pages(states, [False] * len(states), owners)
    painted = [page_map.job_rgba(s)[:3] for s in serials]
    assert painted == colours
    x, y = page_map.pages.cell_origin(2 * 3)
    assert tuple(int(v) for v in page_map.pages.rgba[y + 1, x + 2][:3]) == colours[3]
    assert page_map.describe_page(2 * 3) == "page 6: in use by job 48 — chat number 3"


def _end_visible(pane) -> bool:
    view = pane.view
    bar = view.verticalScrollBar()
    cursor = QTextCursor(view.document())
    cursor.movePosition(QTextCursor.MoveOperation.End)
    rect = view.cursorRect(cursor)
    return bar.value() == bar.maximum() and 0 <= rect.bottom() <= view.viewport().height()


def test_autoscroll_keeps_the_end_of_a_streaming_reply_in_view(qtbot, loop, store, tiny_model):
    """A reply several screens tall: the view follows it, stats line included, after every render. Qt lays
    a text document out after the update (lazily, beyond the viewport), so the scroll range can grow after
    the pane scrolled; the old pane then saw itself "not at the end" and stopped following. Here the
    document's height grows once outside a render (a top margin), as a late layout does."""
    async def body():
        window = make_window(qtbot, store, await loaded_service(tiny_model))
        pane = window.new_chat("scroll")
        pane.view.setFixedHeight(220)  # (the window's own minimum height is another defect's)
        s = pane.session
        s.set_settings(ChatSettings(max_new_tokens=300, seed=3, system_prompt=""))
        seen = []
        render = pane.render_stream

        def checked_render():
            render()
            live = s.live(s.messages[-1].id)
            if live is None:
                return
            if live[1].new_tokens >= 60 and not seen:
                root = pane.view.document().rootFrame()
                fmt = root.frameFormat()
                fmt.setTopMargin(fmt.topMargin() + 300)
                root.setFrameFormat(fmt)
                seen.append(None)
            elif seen:
                seen.append(_end_visible(pane))

        pane.render_stream = checked_render
        pane.send("tell me a long story")
        await wait_until(lambda: s.task.done(), 120, "the reply")
        assert s.messages[-1].stats.state == "done" and s.messages[-1].stats.new_tokens == 300
        assert len(seen) >= 3, "too few renders after the layout grew"
        assert all(seen[1:]), seen  # every render after it showed the end
        qtbot.waitUntil(lambda: _end_visible(pane), timeout=20_000)  # and the finished reply's stats line
        assert "300 new tok" in pane.view.toPlainText().splitlines()[-1]
        await window.service.close()

    run(loop, body())


async def _chat_with_history(qtbot, store, tiny_model, settings, turns):
    """A chat pane on the tiny model whose history (user, assistant) pairs were written straight to the store."""
    service = await loaded_service(tiny_model)
    pane = make_window(qtbot, store, service).new_chat("long")
    s = pane.session
    s.set_settings(settings)
    for user, assistant in turns:
        s.store.add_message(s.chat_id, "user", user)
        s.store.add_message(s.chat_id, "assistant", assistant, ReplyStats(state="done"))
    s.reload()
    return service, pane, s


def test_context_overflow_drops_the_oldest_turns_and_keeps_the_system_prompt(qtbot, loop, store, tiny_model):
    """The tiny model's context is 512 tokens: a long history plus 200 reply tokens can't all fit; a rolling
    window leaves out the oldest turns."""
    async def body():
        settings = ChatSettings(system_prompt="You are terse.", max_new_tokens=200, seed=4,
                                context_overflow="rolling_window")
        turns = [(f"question {i}: " + "alpha beta gamma delta " * 20, f"answer {i}: " + "one two three four " * 10)
                 for i in range(4)]  # ~130 tokens per turn pair
        service, pane, s = await _chat_with_history(qtbot, store, tiny_model, settings, turns)
        limit = service.context_limit()
        assert limit == 512
        history = [{"role": m.role, "content": m.content} for m in s.messages]
        assert service.count_tokens(history, settings) + 200 > limit
        assert f"/ {limit}" in pane.meter.text()
        pane.send("and now?")
        await wait_until(lambda: s.task.done(), 120, "the reply")
        reply = s.messages[-1]
        assert reply.stats.state == "done", reply.stats.error
        assert reply.stats.dropped_messages >= 2 and reply.stats.dropped_messages % 2 == 0
        kept = [{"role": m.role, "content": m.content} for m in s.messages[reply.stats.dropped_messages:-1]]
        assert kept[-1]["content"] == "and now?"
        assert reply.stats.prompt_tokens == service.count_tokens(kept, settings)  # system prompt kept, oldest gone
        assert reply.stats.prompt_tokens + reply.stats.new_tokens <= limit
        assert f"{reply.stats.dropped_turns} turns left out of the prompt" in pane.meter.text()
        await service.close()

    run(loop, body())


def test_a_send_that_drops_turns_tokenizes_its_prompt_once(loop, store, tiny_model, monkeypatch):
    """Fitting counts the prompt again for each turn it drops, and the job needs the kept prompt's ids: all
    of them come from one tokenization, and they are the turns dropped and the ids that encoding each
    candidate prompt gives."""
    import engine
    from app.chat.chat_session import ChatSession
    from app.core.context import fit_context
    from app.local.chat_prompt import encode, prompt_text

    async def body():
        service = await loaded_service(tiny_model)
        settings = ChatSettings(system_prompt="You are terse.", max_new_tokens=200, seed=4)
        chat_id = store.create_chat("long").id
        store.set_settings(chat_id, settings)
        for i in range(4):
            store.add_message(chat_id, "user", f"question {i}: " + "alpha beta gamma delta " * 20)
            store.add_message(chat_id, "assistant", f"answer {i}: " + "one two three four " * 10, ReplyStats(state="done"))
        s = ChatSession(store, chat_id, service)
        history = [{"role": m.role, "content": m.content} for m in s.messages] + [{"role": "user", "content": "and now?"}]
        tok = service.tokenizer
        expected = fit_context(history, settings, lambda h, st: encode(tok, prompt_text(tok, h, st)).shape[-1],
                               service.context_limit())
        expected_ids = encode(tok, prompt_text(tok, expected.history, settings))[0].tolist()
        assert expected.dropped >= 4  # at least two turns left out
        encoded, sent = [], []
        real_encode, real_job = tok.encode, engine.DynamicJobAsync
        monkeypatch.setattr(tok, "encode", lambda *a, **k: encoded.append(a[0]) or real_encode(*a, **k))
        monkeypatch.setattr(engine, "DynamicJobAsync",
                            lambda *a, **k: sent.append(k["input_ids"][0].tolist()) or real_job(*a, **k))
        s.send("and now?")
        await wait_until(lambda: s.task.done(), 120, "the reply")
        assert len(encoded) == 1
        assert s.messages[-1].stats.dropped_messages == expected.dropped and sent == [expected_ids]
        await service.close()

    run(loop, body())


def test_without_truncation_the_reply_gets_the_room_that_is_left(qtbot, loop, store, tiny_model):
    async def body():
        settings = ChatSettings(system_prompt="", max_new_tokens=1024, seed=5, context_overflow="stop_at_limit")
        service, pane, s = await _chat_with_history(qtbot, store, tiny_model, settings,
                                                     [("fill " + "alpha beta gamma delta " * 90, "ok")])
        pane.send("next")
        await wait_until(lambda: s.task.done(), 120, "the reply")
        reply = s.messages[-1]
        assert reply.stats.state == "done", reply.stats.error  # no dead-end ValueError
        room = 512 - reply.stats.prompt_tokens
        assert 0 < room < 1024 and reply.stats.new_tokens <= room and reply.stats.dropped_messages == 0

        # No room at all: a clear error that says what to do, not the engine's ValueError.
        s.store.add_message(s.chat_id, "user", "more " + "alpha beta gamma delta " * 90)
        s.reload()
        await s.regenerate()
        await wait_until(lambda: s.task.done(), 120, "the failing reply")
        err = s.messages[-1].stats.error
        assert s.messages[-1].stats.state == "error" and "context is full" in err and "Context overflow" in err
        assert "ValueError" not in err
        await service.close()

    run(loop, body())


def test_export_header_says_when_it_was_exported(store, tmp_path):
    from app.core.export import export_chat, to_json, to_markdown

    chat = store.create_chat("Old chat")
    store.add_message(chat.id, "user", "hi")
    chat = store.chat(chat.id)
    md = to_markdown(chat, store.messages(chat.id), exported_at=chat.updated + 86400 * 3)
    iso = lambda t: datetime.fromtimestamp(t).astimezone().isoformat(timespec="seconds")  # noqa: E731
    assert f"Exported {iso(chat.updated + 86400 * 3)}" in md
    assert f"updated {iso(chat.updated)}" in md
    doc = json.loads(to_json(chat, store.messages(chat.id), exported_at=chat.updated + 60))
    assert doc["exported"] == iso(chat.updated + 60) and doc["updated"] == iso(chat.updated)

    before = time.time()
    text = export_chat(store, chat.id, tmp_path / "x.md").read_text()
    after = time.time()
    stamp = text.split("*Exported ", 1)[1].split(" ", 1)[0].rstrip("*")
    assert int(before) <= datetime.fromisoformat(stamp).timestamp() <= after
