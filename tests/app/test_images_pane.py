"""Attaching images in a real chat pane (pytest-qt, offscreen) over real tiny models (a text-only one, a
vision one) and a real store:
the Image… tray, drops and pastes, the clear refusal of a model that can't see images (nothing stored,
the draft kept), thumbnails in the transcript, and a remote pagedeck server's 400 shown on the reply."""
from __future__ import annotations

import io

import pytest
from PIL import Image
from PySide6.QtCore import QMimeData, QPoint, QPointF, Qt, QUrl
from PySide6.QtGui import QDragEnterEvent, QDropEvent, QImage, QTextDocument
from PySide6.QtWidgets import QApplication

from app.chat.chat_pane import ChatPane, RenderScheduler
from app.chat.chat_session import ChatSession
from app.core.backend import BackendSwitch
from app.core.images import MessageImages, attach_file
from app.core.remote_backend import RemoteBackend
from app.core.store import ChatSettings
from tests.app.support import loaded_service, loop, run, store, tiny_model, wait_until  # noqa: F401
from tests.engine.test_server_images import seeing, serve  # noqa: F401  (real servers: a process, a seeing one)

pytestmark = pytest.mark.timeout(300)
SETTINGS = ChatSettings(max_new_tokens=4, temperature=0.0)


def write_picture(path, size=(64, 40), colour=(220, 40, 40), fmt="PNG"):
    Image.new("RGB", size, colour).save(path, fmt)
    return str(path)


def make_pane(qtbot, store, backend, title="pictures"):
    session = ChatSession(store, store.create_chat(title, SETTINGS).id, backend)
    pane = ChatPane(session, RenderScheduler())
    qtbot.addWidget(pane)
    pane.resize(700, 500)
    pane.show()
    qtbot.waitExposed(pane)
    return pane


def drop(widget, mime: QMimeData) -> bool:
    pos = QPoint(10, 10)
    enter = QDragEnterEvent(pos, Qt.DropAction.CopyAction, mime, Qt.MouseButton.LeftButton, Qt.KeyboardModifier.NoModifier)
    QApplication.sendEvent(widget, enter)
    if not enter.isAccepted():
        return False
    event = QDropEvent(QPointF(pos), Qt.DropAction.CopyAction, mime, Qt.MouseButton.LeftButton,
                       Qt.KeyboardModifier.NoModifier)
    QApplication.sendEvent(widget, event)
    return event.isAccepted()


def test_text_only_model_refuses_clearly_and_keeps_the_draft(qtbot, loop, store, tiny_model, tmp_path):  # noqa: F811
    async def body():
        service = await loaded_service(tiny_model)
        try:
            pane = make_pane(qtbot, store, BackendSwitch(service))
            min_width = pane.minimumSizeHint().width()
            assert pane.attachments.isHidden() and pane.attachments.button.text() == "Image…"
            # the button's way in (the file dialog's answer), a drop on the transcript, a paste in the prompt box
            pane.attachments.add_files([write_picture(tmp_path / "a.png")])
            assert "cannot see images" in pane.error.text() and "can't be sent" in pane.error.text()
            url = QMimeData()
            url.setUrls([QUrl.fromLocalFile(write_picture(tmp_path / "b.jpg", fmt="JPEG"))])
            assert drop(pane.view.viewport(), url)
            pasted = QMimeData()
            pasted.setImageData(QImage(20, 10, QImage.Format.Format_RGB32))
            pane.prompt.setPlainText("What is this?")
            pane.prompt.insertFromMimeData(pasted)
            assert pane.prompt.toPlainText() == "What is this?"  # the picture went to the tray, not the text
            assert [im.mime for im in pane.attachments.images] == ["image/png", "image/jpeg", "image/png"]
            assert [im.width for im in pane.attachments.images] == [64, 64, 20]
            assert pane.attachments.isVisible()
            assert pane.attachments.summary.text() == "3 images attached · this chat's model reads text only"
            for _ in range(5):
                pane.attachments.add_files([str(tmp_path / "a.png")])
            qtbot.wait(1)
            assert pane.minimumSizeHint().width() == min_width  # thumbnails never widen the pane
            # a bad file, and a file that is no image at all, are refused by name; the tray keeps the rest
            (tmp_path / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n garbage")
            bad = QMimeData()
            bad.setUrls([QUrl.fromLocalFile(str(tmp_path / "broken.png"))])
            assert drop(pane.view.viewport(), bad)
            assert "Image not attached: broken.png: the image is corrupt" in pane.error.text()
            text_file = QMimeData()
            text_file.setUrls([QUrl.fromLocalFile(str(tmp_path / "notes.txt"))])
            assert not drop(pane.view.viewport(), text_file)
            assert len(pane.attachments.images) == 8
            # sending: refused with the reason, nothing stored, the text and the images stay to edit
            pane.submit()
            assert "cannot see images" in pane.error.text() and "the message was not sent" in pane.error.text()
            assert store.messages(pane.session.chat_id) == []
            assert pane.prompt.toPlainText() == "What is this?" and len(pane.attachments.images) == 8
            # removing the images sends the text
            while pane.attachments.images:
                pane.attachments.remove(0)
            assert pane.attachments.isHidden()
            pane.submit()
            await wait_until(lambda: pane.session.task is not None and pane.session.task.done(), 60, "the reply")
            assert [m.role for m in store.messages(pane.session.chat_id)] == ["user", "assistant"]
            # a picture already in the history (sent while a seeing model was loaded): on this text-only model
            # the prompt holds a note in its place, and the reply's stats line says so
            MessageImages(store).add_message(pane.session.chat_id, "user", "and this?",
                                             [attach_file(tmp_path / "a.png")])
            pane.session.reload()
            await pane.session.regenerate()
            await wait_until(lambda: pane.session.task.done(), 60, "the reply to the note")
            assert "1 image not shown to this text-only model" in pane.view.toPlainText()
            assert "64x40 PNG" in pane.view.toPlainText()  # the thumbnail's caption
        finally:
            await service.close()

    run(loop, body())


def test_a_model_that_sees_images_gets_them_stored_and_shown(qtbot, loop, store, tiny_vlm_folder, tmp_path):
    """A tiny random SmolVLM, loaded as the app loads any model (its vision tower found beside it)."""
    import engine

    async def body():
        service = await loaded_service(tiny_vlm_folder)
        pane = make_pane(qtbot, store, BackendSwitch(service))
        assert service.sees_images() is True
        picture = write_picture(tmp_path / "a.png", (300, 200))
        cost = engine.image_token_count(Image.open(picture).convert("RGB"), service.tokenizer, service.vision)
        assert cost > 16  # the vision encoder's layout: tiles, a global view and their tags
        before = int(pane.meter.text().split()[1])
        pane.attachments.add_files([picture])
        assert pane.error.isHidden() or not pane.error.text()
        assert int(pane.meter.text().split()[1]) == before + cost  # the context meter counts the attached image
        assert pane.attachments.summary.text() == f"1 image attached · {cost} tok"
        pane.prompt.setPlainText("Describe it")
        pane.submit()
        assert not pane.attachments.images and not pane.prompt.toPlainText()
        await wait_until(lambda: pane.session.task.done(), 60, "the reply")
        user = store.messages(pane.session.chat_id)[0]
        stored = MessageImages(store).of(user.id)
        assert [(im.width, im.height) for im in stored] == [(300, 200)]
        resource = pane.view.document().resource(QTextDocument.ResourceType.ImageResource, QUrl(f"pdimg:{user.id}/0"))
        assert isinstance(resource, QImage) and (resource.width(), resource.height()) == (160, 106)  # a thumbnail
        shown = pane.view.toPlainText()
        assert f"300x200 PNG · {cost} tok" in shown and f"prompt incl. 1 image: {cost} tok" in shown  # caption, stats
        assert store.messages(pane.session.chat_id)[1].stats.prompt_tokens > cost  # the image went into the prompt
        # the branch keeps the image; so does a new version of the message
        branch = pane.session.branch(user.id)
        assert MessageImages(store).of(store.messages(branch)[0].id) == stored
        await pane.session.edit(user.id, "Describe it again")
        await wait_until(lambda: pane.session.task.done(), 60, "the edited reply")
        assert MessageImages(store).of(pane.session.messages[0].id) == stored
        await service.close()

    run(loop, body())


def test_a_vision_model_reads_the_text_of_messages_without_images(qtbot, loop, store, tiny_vlm_folder, tmp_path):
    async def body():
        service = await loaded_service(tiny_vlm_folder)
        try:
            few = service.count_tokens([{"role": "user", "content": "Hi"}], SETTINGS)
            many = service.count_tokens([{"role": "user", "content": "Hi " * 40}], SETTINGS)
            assert many >= few + 39  # the words are in the prompt
            pane = make_pane(qtbot, store, BackendSwitch(service))
            pane.attachments.add_files([write_picture(tmp_path / "c.png")])  # an image-only message is a message
            pane.submit()
            await wait_until(lambda: pane.session.task.done(), 60, "the image-only reply")
            user, reply = store.messages(pane.session.chat_id)
            assert user.content == "" and len(MessageImages(store).of(user.id)) == 1 and reply.stats.state == "done"
        finally:
            await service.close()

    run(loop, body())


def test_a_remote_text_only_server_s_400_reaches_the_chat(qtbot, loop, store, serve, tmp_path):  # noqa: F811
    async def body(url):
        backend = RemoteBackend(url)
        await backend.connect()
        pane = make_pane(qtbot, store, backend, "remote")
        pane.attachments.add_files([write_picture(tmp_path / "a.png")])
        assert not pane.error.text()  # a remote server answers for itself: no refusal here
        pane.prompt.setPlainText("What is in the picture?")
        pane.submit()
        await wait_until(lambda: pane.session.task is not None and pane.session.task.done(), 60, "the reply")
        reply = store.messages(pane.session.chat_id)[-1]
        assert reply.stats.state == "error"
        assert "HTTP 400" in reply.stats.error and "this model cannot see images" in reply.stats.error
        assert "this model cannot see images" in pane.view.toPlainText()  # shown under the reply
        await backend.close()

    run(loop, body(serve))


def test_a_remote_server_that_sees_images_gets_the_chat_s_images(qtbot, loop, store, tmp_path, seeing):  # noqa: F811
    """The app's remote path end to end, to a real server of a tiny vision model: each reply is stored,
    and the second prompt holds both pictures (the whole history is sent): the server's prompt token
    count grows by more than the second picture's tokens and the text between."""
    async def body(url):
        backend = RemoteBackend(url)
        await backend.connect()
        pane = make_pane(qtbot, store, backend, "remote seeing")
        for i, colour in enumerate(((200, 0, 0), (0, 0, 200))):
            pane.attachments.add_files([write_picture(tmp_path / f"p{i}.png", (40 + i, 30), colour)])
            pane.prompt.setPlainText(f"picture {i}")
            pane.submit()
            await wait_until(lambda: pane.session.task is not None and pane.session.task.done(), 60, "the reply")
            assert store.messages(pane.session.chat_id)[-1].stats.state == "done"
        first, second = [m.stats.prompt_tokens for m in store.messages(pane.session.chat_id) if m.role == "assistant"]
        assert first > 16 and second > first + 16 + 4  # the second picture (a global view alone is 16 image tokens) and the first reply
        await backend.close()

    run(loop, body(seeing.url))
