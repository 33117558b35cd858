"""The prompt format in the real window: a chat names the format it is sent in (a GGUF without template gets
its family's), the Model tab's choice changes what the model is sent at once, is remembered for that model
across a restart of the window, and a broken file's load fails in one line while the model before it
keeps answering."""
from __future__ import annotations

import dataclasses
import gc

import pytest

from app.core.store import Store
from tests.app.support import TINY_CACHE_TOKENS, loop, make_window, run, wait_until  # noqa: F401
from tools.models.synthetic_gguf import write_random_gguf

pytestmark = pytest.mark.timeout(300)
LLAMA3 = dict(chat_tokens=("<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"), bos="<|begin_of_text|>",
              eos="<|end_of_text|>")


@pytest.fixture(scope="module")
def llama3_gguf(tmp_path_factory):
    """A Llama-3-vocabulary model whose file has no chat template."""
    return write_random_gguf(tmp_path_factory.mktemp("fmt") / "llama3-notemplate.gguf", "tiny", 1, "Q8_0",
                             chat_template=False, **LLAMA3)


def sent_text(win, pane) -> str:
    """What the model is sent for a one-message chat now (the prompt ids, special tokens as text)."""
    ids = win.service.prompt_ids([{"role": "user", "content": "Hi"}], pane.session.settings)
    return win.service.tokenizer.decode(ids, decode_special_tokens=True)


def pick(box, choice: str) -> None:
    """Choose an entry in the Model tab's prompt-format box as a user does (activated follows a pick)."""
    index = box.combo.findData(choice)
    assert index >= 0, choice
    box.combo.setCurrentIndex(index)
    box.combo.activated.emit(index)


def test_a_chat_names_its_format_and_the_choice_survives_a_restart(qtbot, loop, tmp_path, llama3_gguf,
                                                                   monkeypatch):
    monkeypatch.setenv("PAGEDECK_SETTINGS", str(tmp_path / "pagedeck.ini"))
    request = {"path": str(llama3_gguf), "cache_tokens": TINY_CACHE_TOKENS}

    async def first_session():
        store = Store.open(tmp_path / "data")
        win = make_window(qtbot, store)
        assert await win.loader.load_model(request)
        pane = win.new_chat("format")
        await wait_until(lambda: pane.prompt_format.text() == "format: Llama 3 (fallback)", what="format shown")
        assert "fallback: Llama 3 (no template in file)" in pane.prompt_format.toolTip()
        assert "fallback: Llama 3 (no template in file)" in win.prompt_format.current.text()
        assert "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>" in sent_text(win, pane)
        pick(win.prompt_format, "plain")
        assert pane.prompt_format.text() == "format: plain completion"
        assert "plain text" in pane.prompt_format.toolTip()
        assert sent_text(win, pane).endswith("Hi") and "<|start_header_id|>" not in sent_text(win, pane)
        await win.service.close()
        win.close()
        store.close()

    async def second_session():
        store = Store.open(tmp_path / "data")
        win = make_window(qtbot, store)
        assert await win.loader.load_model(request)
        pane = win.new_chat("after restart")
        await wait_until(lambda: pane.prompt_format.text() == "format: plain completion", what="format restored")
        assert win.prompt_format.combo.currentData() == "plain"
        assert "<|start_header_id|>" not in sent_text(win, pane)
        pick(win.prompt_format, "auto")  # back to the rule: the choice is forgotten
        assert pane.prompt_format.text() == "format: Llama 3 (fallback)"
        assert win.prefs.chat_template_for(str(llama3_gguf)) == "auto"
        await win.service.close()
        win.close()
        store.close()

    run(loop, first_session())
    run(loop, second_session())


def test_a_broken_file_fails_in_one_line_and_the_model_before_keeps_answering(qtbot, loop, tmp_path, llama3_gguf):
    from engine import Model

    data = llama3_gguf.read_bytes()
    truncated = tmp_path / "truncated.gguf"
    truncated.write_bytes(data[: len(data) // 2])

    async def body():
        store = Store.open(tmp_path / "data")
        win = make_window(qtbot, store)
        assert await win.loader.load_model({"path": str(llama3_gguf), "cache_tokens": TINY_CACHE_TOKENS})
        gc.collect()
        models_before = sum(type(o) is Model for o in gc.get_objects())  # earlier tests' models may linger
        assert await win.loader.load_model({"path": str(truncated), "cache_tokens": TINY_CACHE_TOKENS}) is False
        shown = win.model_panel.error_label.text()
        assert "truncated.gguf is truncated" in shown and "\n" not in shown, shown
        assert "still using llama3-notemplate" in shown
        gc.collect()
        assert sum(type(o) is Model for o in gc.get_objects()) == models_before  # nothing half-loaded is kept
        pane = win.new_chat("still works")
        pane.session.set_settings(dataclasses.replace(pane.session.settings, max_new_tokens=3))
        pane.send("Hi")
        await wait_until(lambda: not pane.session.running, what="the reply")
        reply = pane.session.messages[-1]
        assert reply.role == "assistant" and reply.stats is not None and reply.stats.new_tokens >= 1
        await win.service.close()
        win.close()
        store.close()

    run(loop, body())
