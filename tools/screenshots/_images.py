"""app-image-shared-pages.png: two chats side by side asking about the same picture on a vision model, the
dashboard's page map showing the picture's prompt pages shared by both (hatched).

`python -m tools.screenshots.readme OUTDIR --images-only [--vlm FOLDER]` writes it beside app-image-chat.png. With
no --vlm it builds a tiny random SmolVLM (Idefics3) folder (tests.tiny_vlms: transformers writes it; the
test extras): its replies are random tokens, so the chats' titles say it is a tiny random test model.
The picture is 320 x 320, which the tiny model's processor lays out as 4 x 4 tiles and a global view (about
300 prompt tokens): the first 256-token page is all template text and picture, and both chats hold it.
"""
from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path

from tools.screenshots._session import reply_state

SMALL_CACHE = 16 * 256  # 16 pages: big cells on the page map


async def image_shared_pages(outdir: Path, seconds: float, data_dir: Path, picture: bytes,
                             vlm: Path | None = None) -> list[Path]:
    from dataclasses import replace

    from app.window.main_window import MainWindow

    tiny = vlm is None
    with tempfile.TemporaryDirectory(prefix="pagedeck-tiny-vlm-") as scratch:
        if tiny:
            from tests.tiny_vlms import write_tiny_vlm_folder

            vlm = write_tiny_vlm_folder(Path(scratch) / "tiny-random-smolvlm")
        window = MainWindow(data_dir=data_dir, load_request={"path": str(vlm), "cache_tokens": SMALL_CACHE})
        window.show()
        window.resize(1600, 900)
        try:
            if not await window.loader.ready():
                raise SystemExit(f"model did not load: {window.status.last_error}")
            if not window.service.sees_images():
                raise SystemExit(f"{vlm} has no vision encoder this app can run")
            label = " · tiny random test VLM" if tiny else ""  # its replies are noise: say so on the tile
            panes = [window.new_chat(f"Picture {i + 1}{label}") for i in range(2)]
            from PySide6.QtCore import Qt

            window.resizeDocks([window.dashboard], [440], Qt.Orientation.Horizontal)  # a page map to read
            window.chats.show_side_by_side(panes)
            window.dashboard.set_identifier_labels({p.session.chat_id: p.session.chat.title for p in panes})
            for pane, question in zip(panes, ("What do you see in this picture?",) * 2):
                pane.session.set_settings(replace(pane.session.settings, max_new_tokens=400, temperature=0.8))
                if not pane.attachments.add_bytes(picture):
                    raise SystemExit(f"the picture was not attached: {pane.error.text()}")
                pane.prompt.setPlainText(question)
            for pane in panes:
                pane.submit()
            loop = asyncio.get_running_loop()
            deadline = loop.time() + seconds
            service = window.service
            while loop.time() < deadline:  # both replies streaming, the picture's page held by both
                snap = service.snapshot()
                states = [reply_state(p.session) for p in panes]
                if any(error for _, error in states):
                    raise SystemExit(f"a chat failed, no screenshot taken: {next(e for _, e in states if e)}")
                streamed = all(len(text) > 80 for text, _ in states)
                if snap is not None and sum(snap["page_shared"]) >= 1 and snap["active_jobs"] == 2 and streamed:
                    break
                await asyncio.sleep(0.05)
            else:
                raise SystemExit(f"the two chats did not share pages in time (shared pages "
                                 f"{sum(snap['page_shared']) if snap else None}, active jobs "
                                 f"{snap['active_jobs'] if snap else None}); no screenshot taken")
            await asyncio.sleep(0.3)  # let the loop paint the dashboard's next snapshot
            path = outdir / "app-image-shared-pages.png"
            if not window.grab().save(str(path)):
                raise OSError(f"could not write screenshot {path}")
            return [path]
        finally:
            await window.shutdown()
            window.close()
