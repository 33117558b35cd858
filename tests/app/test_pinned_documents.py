"""Pinned documents on a real generator (tiny random model, 512-token context) in the real window: the
document leads the prompt, so chats pinning the same one share its cache pages; the context meter counts
it; a document too big for the context is refused; PDFs are read with pypdf; pins persist and branch."""
import pytest

from app.core.documents import PinnedDocuments, read_document
from app.core.store import ChatSettings, Store
from tests.app.support import loaded_service, loop, make_window, run, store, tiny_model, wait_until  # noqa: F401

pytestmark = pytest.mark.timeout(240)

DOC = "Harbour log. " + " ".join(f"Boat {i} left at dawn with ropes and nets." for i in range(25))


def write_pdf(path, lines: list[str]) -> None:
    """A one-page PDF whose text is `lines` (Helvetica), written object by object with a correct xref."""
    text = " T* ".join(f"({line}) Tj" for line in lines)
    stream = f"BT /F1 12 Tf 14 TL 72 720 Td {text} ET".encode()
    objects = [b"<< /Type /Catalog /Pages 2 0 R >>", b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
               b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 4 0 R "
               b"/Resources << /Font << /F1 5 0 R >> >> >>",
               b"<< /Length %d >>\nstream\n" % len(stream) + stream + b"\nendstream",
               b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>"]
    out, offsets = bytearray(b"%PDF-1.4\n"), []
    for n, body in enumerate(objects, 1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % n + body + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % o for o in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objects) + 1, xref)
    path.write_bytes(bytes(out))


def test_chats_pinning_the_same_document_share_its_pages(qtbot, loop, store, tiny_model, tmp_path):
    async def body():
        doc = tmp_path / "harbour.txt"
        doc.write_text(DOC)
        window = make_window(qtbot, store, await loaded_service(tiny_model))
        service = window.service
        a, b = window.new_chat("a"), window.new_chat("b")
        a.session.set_settings(ChatSettings(system_prompt="You are A.", max_new_tokens=10, stop_on_loops=False))
        b.session.set_settings(ChatSettings(system_prompt="You are B, another one.", max_new_tokens=10,
                                            stop_on_loops=False))
        window.chats.show_side_by_side([a, b])
        window.chats.set_compare(True)
        before = int(a.meter.text().split()[1])
        assert window.chats.compare.pin_document(str(doc)) == 2  # pinned to both ticked panes
        doc_tokens = service.count_tokens([], a.session.prompt_settings()) - service.count_tokens([], a.session.settings)
        assert doc_tokens > 256  # more than a page
        assert int(a.meter.text().split()[1]) == before + doc_tokens  # the meter counts it
        assert a.pinned_list.isVisible() and "harbour.txt" in a.pinned_list.labels[0].text()
        assert "tokens" in a.pinned_list.labels[0].text()
        a.send("What left at dawn?")
        await wait_until(lambda: not a.session.running, 60, "a's reply")
        b.send("Which boats?")
        await wait_until(lambda: not b.session.running, 60, "b's reply")
        ra, rb = a.session.messages[1].stats, b.session.messages[1].stats
        assert ra.state == rb.state == "done"
        assert ra.prompt_tokens > doc_tokens and ra.cached_tokens == 0
        assert rb.cached_tokens >= 256  # b's prompt starts with a's document pages, found in the cache
        assert rb.cached_tokens <= doc_tokens + 16  # only the shared prefix (the system prompts differ after it)
        # pins persist with the chat, and a branch keeps them
        branch_id = b.branch(b.session.messages[-1].id)
        assert [d.name for d in window.chats.sessions[branch_id].pinned()] == ["harbour.txt"]
        a.pinned_list.unpin_buttons[0].click()
        assert a.session.pinned() == [] and not a.pinned_list.isVisible()
        assert a.session.prompt_settings().system_prompt == "You are A."  # the next prompt leaves it out
        await service.close()

    run(loop, body())


def test_a_document_too_big_for_the_context_is_refused(qtbot, loop, store, tiny_model, tmp_path):
    async def body():
        big = tmp_path / "big.txt"
        big.write_text(DOC * 4)  # ~1400 tokens: the tiny model's context holds 512
        window = make_window(qtbot, store, await loaded_service(tiny_model))
        pane = window.new_chat("big")
        assert not pane.pin_document(str(big))
        assert pane.error.isVisible()
        message = pane.error.text()
        assert "big.txt is too big for the model's context" in message and "holds 512" in message, message
        assert pane.session.pinned() == []
        # a chat can still be sent to; the other document kinds give clear errors too
        empty = tmp_path / "empty.txt"
        empty.write_text("  \n")
        binary = tmp_path / "blob.bin"
        binary.write_bytes(bytes(range(256)))
        assert not pane.pin_document(str(empty)) and "has no text" in pane.error.text()
        assert not pane.pin_document(str(binary)) and "not a UTF-8 text file" in pane.error.text()
        await window.service.close()

    run(loop, body())


def test_pdf_text_is_pinned_and_persists(qtbot, loop, tmp_path, tiny_model):
    async def body():
        pdf = tmp_path / "notes.pdf"
        write_pdf(pdf, ["Harbour notes", "The red boat leaves at noon."])
        name, text = read_document(pdf)
        assert name == "notes.pdf" and "Harbour notes" in text and "red boat leaves at noon" in text
        store = Store.open(tmp_path / "data")
        window = make_window(qtbot, store, await loaded_service(tiny_model))
        pane = window.new_chat("pdf")
        assert pane.pin_document(str(pdf)), pane.error.text()
        settings = pane.session.prompt_settings()
        assert settings.system_prompt.startswith('<document name="notes.pdf">\nHarbour notes')
        ids = window.service.prompt_ids([{"role": "user", "content": "when?"}], settings)[0].tolist()
        assert window.service.tokenizer.decode(ids).count("red boat leaves at noon") == 1
        chat_id = pane.session.chat_id
        await window.service.close()
        store.close()
        again = Store.open(tmp_path / "data")
        assert [(d.name, d.content) for d in PinnedDocuments(again).of(chat_id)] == [("notes.pdf", text)]
        again.close()

    run(loop, body())
