"""The README's compare-mode screenshot: `python -m tools.screenshots.compare OUTDIR [--size WxH]`.

Opens the real main window (under Xvfb: `xvfb-run -s "-screen 0 1920x1080x24"`) on a scratch history
with the embedded default model, makes four chats that differ in their settings (sampler presets, one on
the pirate demo adapter), tiles them in compare mode, pins one document to all four, sends one question
from the compare bar and grabs the window mid-stream as app-compare-4.png.
"""
from __future__ import annotations

import argparse
import asyncio
from dataclasses import replace
from pathlib import Path
from typing import Sequence

from tools.screenshots._session import qt_session, save_grab, until_streamed

QUESTION = "In two sentences: what should a visitor to the harbour do first?"
DOCUMENT = ("Harbour guide. The ferry leaves the north pier every hour. The fish market opens at six and "
            "closes at noon. The lighthouse museum is free on Sundays. Boats can be hired at the south "
            "quay; life jackets are required. The harbour café serves grilled sardines.\n"
            + "".join(f"Pier {i}: the {name} ferry leaves every {10 + i} minutes; tickets at kiosk {i}, "
                      f"{'step-free access' if i % 2 else 'stairs only'}, waiting room open {6 + i % 4}:00 to 22:00.\n"
                      for i, name in enumerate(("island", "river", "lagoon", "coast", "night", "market", "fort",
                                                "lighthouse", "beach", "old town", "bridge", "canal"))))


async def _compare(outdir: Path, seconds: float, data_dir: Path, size: tuple[int, int]) -> Path:
    from app.core.presets import BUILTIN_PRESETS, apply_preset
    from app.window.main_window import MainWindow
    from engine.contract import demo_adapters_folder

    window = MainWindow(data_dir=data_dir)
    window.show()
    window.resize(*size)
    try:
        if not await window.loader.ready():
            raise SystemExit(f"model did not load: {window.status.last_error}")
        if not await window.service.load_adapter(demo_adapters_folder() / "pirate"):
            raise SystemExit(f"could not load the pirate adapter: {window.status.last_error}")
        looks = (("Balanced", None), ("Precise", None), ("Creative", None), ("Balanced", (("pirate", 1.0),)))
        panes = []
        for n, (preset, loras) in enumerate(looks):
            pane = window.new_chat(f"{preset}{' + pirate' if loras else ''}")
            settings = apply_preset(pane.session.settings, BUILTIN_PRESETS[preset])
            pane.session.set_settings(replace(settings, loras=loras, max_new_tokens=200, seed=n))
            panes.append(pane)
        window.chats.show_side_by_side(panes)
        window.chats.set_compare(True)
        doc = data_dir / "harbour-guide.txt"
        doc.write_text(DOCUMENT)
        if window.chats.compare.pin_document(str(doc)) != 4:
            raise SystemExit(f"could not pin the document: {window.chats.compare.message.text()}")
        window.dashboard.set_identifier_labels({p.session.chat_id: p.session.chat.title for p in panes})
        window.chats.compare.prompt.setPlainText(QUESTION)
        window.chats.compare.send_typed()
        for _ in range(int(seconds * 10)):  # panes sharing the leader's prefix are sent once it has read it
            if all(p.session.messages for p in panes):
                break
            await asyncio.sleep(0.1)
        await until_streamed([p.session for p in panes], 60, seconds)
        await asyncio.sleep(0.2)  # let the loop paint
        path = outdir / "app-compare-4.png"
        save_grab(window, path)
        return path
    finally:
        await window.shutdown()
        window.close()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Save the compare-mode screenshot (four panes).")
    parser.add_argument("outdir", type=Path)
    parser.add_argument("--seconds", type=float, default=90.0, help="the longest to wait for the replies")
    parser.add_argument("--size", default="1920x1080", help="window size WxH")
    args = parser.parse_args(argv)
    size = tuple(int(v) for v in args.size.lower().split("x"))
    args.outdir.mkdir(parents=True, exist_ok=True)
    with qt_session("pagedeck-compare-") as (loop, data_dir):
        print(loop.run_until_complete(_compare(args.outdir, args.seconds, data_dir, size)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
