"""A tiny random SmolVLM loaded in the real app (pytest-qt, offscreen): the engine service finds its vision
tower, the attach tray prices an image with the encoder's own layout, a chat with an image streams a reply
whose stats line counts the image's tokens, and two chats asking about the same image share its pages."""
from __future__ import annotations

from dataclasses import replace

import pytest
from PIL import Image

from app.core.backend import BackendSwitch
from tests.app.support import loaded_service, loop, run, store, tiny_model, wait_until  # noqa: F401
from tests.app.test_images_pane import SETTINGS, make_pane

pytestmark = pytest.mark.timeout(300)


def noisy_picture(path, size=(300, 300), seed=3):
    import numpy as np

    g = np.random.default_rng(seed)
    Image.fromarray(g.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8), "RGB").save(path, "PNG")
    return str(path)


def test_a_vision_model_in_the_app_sees_images_and_two_chats_share_the_image_s_pages(
        qtbot, loop, store, tiny_vlm_folder, tmp_path):  # noqa: F811
    import engine

    async def body():
        service = await loaded_service(tiny_vlm_folder)
        try:
            assert service.vision is not None and service.sees_images() is True
            picture = noisy_picture(tmp_path / "p.png")
            cost = engine.image_token_count(Image.open(picture).convert("RGB"), service.tokenizer, service.vision)
            assert cost > 16 * 16  # 256 px: 4 x 4 tiles of 64 px and the global view, 16 tokens each, and tags
            panes = [make_pane(qtbot, store, BackendSwitch(service), f"chat {i}") for i in range(2)]
            for pane in panes:
                pane.attachments.add_files([picture])
                assert pane.attachments.summary.text() == f"1 image attached · {cost} tok"
                pane.prompt.setPlainText("What is in this picture?")
            panes[0].submit()
            await wait_until(lambda: panes[0].session.task.done(), 120, "the first reply")
            panes[1].submit()
            await wait_until(lambda: panes[1].session.task.done(), 120, "the second reply")
            replies = [store.messages(p.session.chat_id)[-1] for p in panes]
            assert all(r.stats.state == "done" and r.stats.new_tokens > 0 for r in replies)
            assert replies[0].stats.prompt_tokens == replies[1].stats.prompt_tokens > cost
            assert replies[1].stats.cached_tokens >= cost  # the second chat reused the first's image pages
            for pane in panes:
                assert f"prompt incl. 1 image: {cost} tok" in pane.view.toPlainText()
            # both at once: the image's full page is held by both jobs (the page map's shared pages)
            seen = []
            for pane in panes:
                pane.session.set_settings(replace(pane.session.settings, max_new_tokens=48))
                await pane.session.regenerate()
            await wait_until(lambda: seen.append(sum(service.snapshot()["page_shared"]))
                             or all(p.session.task.done() for p in panes), 120, "both replies")
            assert max(seen) >= 1
        finally:
            await service.close()

    run(loop, body())


def test_a_vision_model_beside_a_text_model_sees_images_in_its_chats(qtbot, loop, store, tiny_model,
                                                                     tiny_vlm_folder, tmp_path):  # noqa: F811
    """Compare mode: the main model reads text only, the model loaded beside it sees images; a chat on the
    second gets its picture priced and answered, a chat on the main one is refused."""
    async def body():
        service = await loaded_service(tiny_model)
        try:
            assert await service.load_beside(tiny_vlm_folder)
            on_vlm = replace(SETTINGS, model=str(tiny_vlm_folder))
            assert service.sees_images() is False and service.sees_images(on_vlm) is True
            picture = noisy_picture(tmp_path / "p.png", (64, 64))
            assert service.image_tokens(Image.open(picture).convert("RGB")) is None
            cost = service.image_tokens(Image.open(picture).convert("RGB"), on_vlm)
            assert cost is not None and cost >= 16
            pane = make_pane(qtbot, store, BackendSwitch(service), "beside")
            pane.session.set_settings(on_vlm)
            pane.attachments.add_files([picture])
            assert pane.attachments.summary.text() == f"1 image attached · {cost} tok"
            pane.prompt.setPlainText("What is it?")
            pane.submit()
            await wait_until(lambda: pane.session.task.done(), 120, "the reply on the model beside")
            reply = store.messages(pane.session.chat_id)[-1]
            assert reply.stats.state == "done" and reply.stats.prompt_tokens > cost
            assert f"prompt incl. 1 image: {cost} tok" in pane.view.toPlainText()
            main = make_pane(qtbot, store, BackendSwitch(service), "main")
            main.attachments.add_files([picture])
            assert "cannot see images" in main.error.text()
        finally:
            await service.close()

    run(loop, body())
