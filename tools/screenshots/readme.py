"""Screenshots for the README: `python -m tools.screenshots.readme OUTDIR [--dashboard-only | --lora-only | --batch-only]
[--size WxH]`.

The full run opens the real main window (sized to fill a WxH screen, e.g. under `xvfb-run -s
"-screen 0 1366x768x24"`) on a scratch history folder, starts four chats streaming (three
tiled side by side) through the one batched generator and grabs PNGs of the window and the dashboard
while they stream. dashboard.png (always written, and all that `--dashboard-only` writes) is the dashboard
fed a simulated but plausible snapshot sequence (tools.simulated_workload, also used by the dashboard
benchmark): it needs no model and is deterministic. app-lora-chats.png (`--lora-only` writes only it) is
two chats on different demo adapters (pirate, bullets) streaming at once, the page map coloured by adapter.

`--scale 2` takes a HiDPI screen: Qt scales by 2 (QT_SCALE_FACTOR) and the window is WxH device pixels, so
`--size 2560x1440 --scale 2` lays out at 1280x720 logical pixels and saves 2560x1440 PNGs named ...@2x.
discover-<size>.png is the Discover tab after a search and a download, against a local Hub server
(tools.peers.fake_hub serving the embedded model's GGUF) into a scratch cache: nothing leaves the machine.
app-prompt-format.png (`--format-only` writes only it) is a chat with the default model copied without its
chat template: the chat and the Model tab name the fallback format the model's vocabulary picked.
batch-run.png (`--batch-only`) is the Batch tab running a template over twelve product reviews.
app-image-chat.png (`--images-only`) is a chat with images on the default (text-only) model: a stored
picture shown as a thumbnail with the model's real reply (it was told the image is not shown to it),
a new picture attached in the tray, and the clear refusal when it is sent; `--images-only` also writes
app-image-shared-pages.png (tools.screenshots._images): two chats on one picture sharing its pages.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path
from typing import Sequence

from tools.screenshots._session import qt_session, save_grab, until_streamed
from tools.simulated_workload import CHATS, SimulatedWorkload

PROMPTS = (
    "Explain, with a short code example, why Rust's borrow checker rejects two mutable references.",
    "Plan a relaxed three-day trip to Lisbon with food recommendations for each day.",
    "Show how SQL window functions compute a running total, then a rank per group.",
    "Write a short poem about autumn leaves in the style of a haiku sequence.",
)

def save_dashboard_screenshot(path: Path, seconds: float = 75.0, pages_total: int = 512,
                              size: tuple[int, int] = (560, 980)) -> Path:
    """Feed the dashboard a simulated run and save it as PNG (needs a QApplication)."""
    from PySide6.QtWidgets import QApplication

    from app.panels.dashboard import DashboardDock

    app = QApplication.instance() or QApplication([])
    dock = DashboardDock()
    dock.set_identifier_labels(dict(CHATS))
    dock.resize(*size)
    dock.show()
    work = SimulatedWorkload(pages_total=pages_total, seed=7)
    for _ in range(int(seconds / 0.1)):
        dock.push(work.step(0.1))
    for _ in range(300):  # end on a busy moment: a screenshot of an idle cache shows little
        if dock.snapshot["active_jobs"] >= 6:
            break
        dock.push(work.step(0.1))
    shared = [i for i, s in enumerate(dock.snapshot["page_shared"]) if s]
    if shared:  # what hovering a shared page shows
        dock.page_map.show_page_info(shared[-1])
    app.processEvents()
    path.parent.mkdir(parents=True, exist_ok=True)
    save_grab(dock, path)
    dock.close()
    return path


async def _discover(outdir: Path, data_dir: Path, size: tuple[int, int], tag: str, theme: str) -> list[Path]:
    """The Discover tab after searching a local Hub server and downloading its one GGUF into a scratch cache."""
    from app.discover.hub import Hub
    from app.window.main_window import MainWindow
    from engine.model.weights import default_model_path
    from tools.peers.fake_hub import FakeHub

    model = default_model_path()
    hub = FakeHub({"HuggingFaceTB/SmolLM2-135M-Instruct-GGUF": {"smollm2-135m-instruct-q4_1.gguf": model.read_bytes()},
                   "HuggingFaceTB/SmolLM2-360M-Instruct": {"config.json": b"{}", "model.safetensors": b"0" * 4096}}).start()
    window = MainWindow(data_dir=data_dir)
    window.theme.set_mode(theme)
    view = window.discover
    view._hub, view._cache_dir = Hub(endpoint=hub.url, token=False), data_dir / "hub-cache"
    window.show()
    window.resize(*size)
    window.dock("Discover").raise_()
    try:
        view.query.setText("smollm2")
        view.search()
        await _until(lambda: view.repo_list.topLevelItemCount() == 2)
        view.repo_list.setCurrentItem(view.repo_list.topLevelItem(0))
        await _until(lambda: view.file_list.topLevelItemCount() == 1)
        view.file_list.setCurrentItem(view.file_list.topLevelItem(0))
        view.download_or_pause()
        await _until(lambda: view.load_button.isEnabled())
        await asyncio.sleep(0.3)
        path = outdir / f"discover-{tag}{'-dark' if theme == 'dark' else ''}.png"
        save_grab(window, path)
        return [path]
    finally:
        hub.stop()
        await window.shutdown()
        window.close()


async def _until(predicate, timeout: float = 60.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        if loop.time() > deadline:
            raise SystemExit("the Discover view did not get there in time; no screenshot taken")
        await asyncio.sleep(0.05)


async def _stream_main_window(outdir: Path, seconds: float, data_dir: Path, size: tuple[int, int],
                              theme: str = "light", tag: str = "") -> list[Path]:
    """Open MainWindow on a scratch history, stream one chat per prompt side by side, grab PNGs mid-stream."""
    from app.window.main_window import MainWindow

    window = MainWindow(data_dir=data_dir)
    window.theme.set_mode(theme)  # written to the scratch preferences file (PAGEDECK_SETTINGS, set in main)
    window.show()
    window.resize(*size)  # as if maximized on a WxH screen (Xvfb has no window manager to do it)
    try:
        if not await window.loader.ready():  # the model loads off the UI thread
            raise SystemExit(f"model did not load: {window.status.last_error}")
        panes = [window.new_chat(title) for _, title in CHATS[:len(PROMPTS)]]
        window.chats.show_side_by_side(panes[:3])
        window.dashboard.set_identifier_labels({p.session.chat_id: p.session.chat.title for p in panes})
        for pane, prompt in zip(panes, PROMPTS):  # the 4th streams in the background: the batch holds all four
            pane.prompt.setPlainText(prompt)
            pane.submit()
        sessions = [p.session for p in panes]
        saved = []
        for i, min_chars in enumerate((120, 400)):
            await until_streamed(sessions, min_chars, seconds / 2)
            await asyncio.sleep(0.1)  # let the loop paint; processEvents() here would re-enter the running tasks
            name = f"{tag or f'{size[0]}x{size[1]}'}{'-dark' if theme == 'dark' else ''}-{i + 1}"
            shots = [(f"app-streaming-{name}.png", window), (f"dashboard-live-{name}.png", window.dashboard)]
            for name, widget in shots:
                path = outdir / name
                save_grab(widget, path)
                saved.append(path)
    finally:  # stop the generator's worker thread even when a shot failed
        await window.shutdown()
        window.close()
    return saved


async def _stream_lora_chats(outdir: Path, seconds: float, data_dir: Path) -> list[Path]:
    """Two chats, each its own demo adapter (per-job LoRA), streaming side by side in one batch."""
    from dataclasses import replace

    from app.window.main_window import MainWindow
    from engine.contract import demo_adapters_folder

    window = MainWindow(data_dir=data_dir)
    window.resize(1900, 1050)
    window.show()
    try:
        if not await window.loader.ready():
            raise SystemExit(f"model did not load: {window.status.last_error}")
        folder = demo_adapters_folder()
        chats = (("pirate", "Tell me about your favourite food."), ("bullets", "Tell me about your favourite food."))
        for name, _ in chats:
            if not await window.service.load_adapter(folder / name):
                raise SystemExit(f"could not load the demo adapter {name}: {window.status.last_error}")
        panes = []
        for name, prompt in chats:
            pane = window.new_chat(f"{name} adapter")
            pane.session.set_settings(replace(pane.session.settings, loras=((name, 1.0),)))
            panes.append((pane, prompt))
        window.chats.show_side_by_side([p for p, _ in panes])
        window.dashboard.page_map.by_adapter.setChecked(True)
        for pane, prompt in panes:
            pane.prompt.setPlainText(prompt)
            pane.submit()
        await until_streamed([p.session for p, _ in panes], 200, seconds)
        await asyncio.sleep(0.1)  # let the loop paint; processEvents() here would re-enter the running tasks
        path = outdir / "app-lora-chats.png"
        save_grab(window, path)
        return [path]
    finally:
        await window.shutdown()
        window.close()


async def _prompt_format_chat(outdir: Path, seconds: float, data_dir: Path) -> list[Path]:
    """A chat on the default model without its chat template: the fallback named in the chat and the Model tab."""
    import subprocess
    from dataclasses import replace

    from app.window.main_window import MainWindow
    from engine.model.weights import default_model_path

    model = data_dir / "SmolLM2-135M-Instruct-no-template.gguf"
    subprocess.run([sys.executable, "-m", "gguf.scripts.gguf_new_metadata", "--remove-metadata",
                    "tokenizer.chat_template", "--force", str(default_model_path()), str(model)],
                   check=True, capture_output=True)
    window = MainWindow(data_dir=data_dir, load_request={"path": str(model)})
    window.show()
    window.resize(1366, 768)
    try:
        if not await window.loader.ready():
            raise SystemExit(f"model did not load: {window.status.last_error}")
        window.dock("Model").raise_()
        pane = window.new_chat("No template in the file")
        pane.session.set_settings(replace(pane.session.settings, max_new_tokens=60, temperature=0.0))
        pane.prompt.setPlainText("What is the capital of France? Answer in one sentence.")
        pane.submit()
        await until_streamed([pane.session], 10, seconds)
        while pane.session.running:
            await asyncio.sleep(0.1)
        await asyncio.sleep(0.2)  # let the loop paint
        path = outdir / "app-prompt-format.png"
        save_grab(window, path)
        return [path]
    finally:
        await window.shutdown()
        window.close()


def _demo_picture(width: int = 480, height: int = 320) -> bytes:
    """A small landscape (sky, sun, hills) drawn with Pillow: something recognisable as a thumbnail."""
    import io

    from PIL import Image, ImageDraw

    img = Image.new("RGB", (width, height))
    draw = ImageDraw.Draw(img)
    for y in range(height):  # sky gradient
        t = y / height
        draw.line([(0, y), (width, y)], fill=(int(90 + 120 * t), int(150 + 80 * t), 235))
    draw.ellipse([width * 0.68, height * 0.12, width * 0.84, height * 0.36], fill=(255, 214, 90))
    draw.polygon([(0, height), (0, height * 0.62), (width * 0.35, height * 0.45), (width * 0.7, height * 0.7),
                  (width, height * 0.55), (width, height)], fill=(70, 140, 80))
    draw.polygon([(0, height), (width * 0.25, height * 0.78), (width * 0.6, height * 0.9), (width, height * 0.8),
                  (width, height)], fill=(45, 110, 60))
    buf = io.BytesIO()
    img.save(buf, "PNG")
    return buf.getvalue()


async def _image_chat(outdir: Path, seconds: float, data_dir: Path) -> list[Path]:
    """A chat with images on the default text-only model (see the module docstring)."""
    from dataclasses import replace

    from app.core.images import MessageImages, attach_bytes
    from app.window.main_window import MainWindow

    window = MainWindow(data_dir=data_dir)
    window.show()
    window.resize(1366, 768)
    try:
        if not await window.loader.ready():
            raise SystemExit(f"model did not load: {window.status.last_error}")
        window.dock("Model").raise_()
        pane = window.new_chat("A picture")
        session = pane.session
        session.set_settings(replace(session.settings, max_new_tokens=60, temperature=0.0))
        picture = attach_bytes(_demo_picture())
        MessageImages(session.store).add_message(session.chat_id, "user", "What do you see in this picture?",
                                                 [picture])
        session.reload()
        await session.regenerate()  # the real reply: the model was told an image is there that it can't see
        await _until(lambda: session.task is not None and session.task.done(), seconds)
        pane.attachments.add_bytes(_demo_picture(320, 320))  # a second picture in the tray
        pane.prompt.setPlainText("And this one?")
        pane.submit()  # refused: the model reads text only; the draft stays
        await asyncio.sleep(0.3)  # let the loop paint
        path = outdir / "app-image-chat.png"
        save_grab(window, path)
        return [path]
    finally:
        await window.shutdown()
        window.close()


REVIEWS = (
    ("kettle", "Boils fast but the lid rattles."), ("phone", "Battery lasts two days; the screen is dim outdoors."),
    ("shoes", "Comfortable, though they ran half a size small."), ("blender", "Loud, and it leaks at the base."),
    ("tent", "Dry through a night of heavy rain."), ("headphones", "Warm sound; the app keeps disconnecting."),
    ("desk lamp", "Bright, and the arm stays put."), ("coffee grinder", "Consistent grind but messy."),
    ("backpack", "The straps frayed after a month."), ("air fryer", "Cooks evenly and cleans easily."),
    ("keyboard", "Feels great, the keys are a bit loud."), ("umbrella", "Flipped inside out in light wind."),
)


async def _batch_run(outdir: Path, seconds: float, data_dir: Path) -> list[Path]:
    """The Batch tab mid-run: twelve product reviews through one template, rows filling in as they finish."""
    import csv

    from PySide6.QtCore import Qt

    from app.window.main_window import MainWindow

    inputs = data_dir / "reviews.csv"
    data_dir.mkdir(parents=True, exist_ok=True)
    with open(inputs, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["product", "review"])
        w.writerows(REVIEWS)
    window = MainWindow(data_dir=data_dir)
    window.resize(1900, 1050)
    window.show()
    try:
        if not await window.loader.ready():
            raise SystemExit(f"model did not load: {window.status.last_error}")
        dock = window.dock("Batch")
        dock.raise_()
        window.resizeDocks([dock], [1000], Qt.Orientation.Horizontal)
        view = window.batch_view
        view.file.setText(str(inputs))
        view.template.setText("Summarise this {product} review in five words: {review}")
        view.system.setText("You are a concise product analyst.")
        view.max_tokens.setValue(24)
        view.start_btn.click()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        while view.progress.value() < 7 and loop.time() < deadline:
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.1)  # let the loop paint; processEvents() here would re-enter the running tasks
        path = outdir / "batch-run.png"
        save_grab(window, path)
        return [path]
    finally:
        await window.shutdown()
        window.close()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Save README screenshots of pagedeck.")
    parser.add_argument("outdir", type=Path)
    parser.add_argument("--dashboard-only", action="store_true",
                        help="only the dashboard, fed by a simulated workload (no model needed)")
    parser.add_argument("--seconds", type=float, default=60.0,
                        help="the longest to let the chats stream before the screenshots are taken")
    parser.add_argument("--lora-only", action="store_true",
                        help="only app-lora-chats.png: two chats on different adapters (needs the model)")
    parser.add_argument("--format-only", action="store_true",
                        help="only app-prompt-format.png: a chat naming its fallback prompt format (needs the model)")
    parser.add_argument("--batch-only", action="store_true",
                        help="only batch-run.png: the Batch tab mid-run (needs the model)")
    parser.add_argument("--images-only", action="store_true",
                        help="only app-image-chat.png (a chat with attached images on the text-only default model) "
                             "and app-image-shared-pages.png (two chats on the same picture, a vision model)")
    parser.add_argument("--vlm", type=Path, metavar="FOLDER",
                        help="the vision model of app-image-shared-pages.png (default: a tiny random SmolVLM)")
    parser.add_argument("--size", default="1920x1080", help="window size WxH (the screen it is shown for)")
    parser.add_argument("--theme", choices=("light", "dark"), default="light",
                        help="the app's theme for the main-window shots (dark ones are named ...-dark-N.png)")
    parser.add_argument("--scale", type=int, default=1, help="the screen's scale factor (2: HiDPI; --size is in "
                        "device pixels, the window lays out at size/scale)")
    parser.add_argument("--discover", action="store_true", help="also discover-<size>.png: the Discover tab "
                        "against a local Hub server")
    args = parser.parse_args(argv)
    try:
        pixels = tuple(int(v) for v in args.size.lower().split("x"))
        if len(pixels) != 2 or min(pixels) < 1 or args.scale < 1:
            raise ValueError
    except ValueError:
        parser.error(f"--size must be WIDTHxHEIGHT, e.g. 1366x768, and --scale >= 1; got {args.size!r}")
    size = (pixels[0] // args.scale, pixels[1] // args.scale)  # the window's logical size
    tag = f"{pixels[0]}x{pixels[1]}" + (f"@{args.scale}x" if args.scale != 1 else "")
    if args.scale != 1:
        os.environ["QT_SCALE_FACTOR"] = str(args.scale)  # before the QApplication exists
    args.outdir.mkdir(parents=True, exist_ok=True)
    from PySide6.QtWidgets import QApplication

    app = QApplication.instance() or QApplication(sys.argv[:1])
    only = args.lora_only or args.format_only or args.batch_only or args.images_only
    saved = [] if only else [save_dashboard_screenshot(args.outdir / "dashboard.png")]
    if not args.dashboard_only:
        with qt_session("pagedeck-shots-") as (loop, data_dir):
            if args.format_only:
                saved += loop.run_until_complete(_prompt_format_chat(args.outdir, args.seconds, Path(data_dir)))
            elif args.images_only:
                from tools.screenshots._images import image_shared_pages

                saved += loop.run_until_complete(_image_chat(args.outdir, args.seconds, Path(data_dir) / "images"))
                saved += loop.run_until_complete(image_shared_pages(
                    args.outdir, args.seconds, Path(data_dir) / "vlm", _demo_picture(320, 320), args.vlm))
            elif args.batch_only:
                saved += loop.run_until_complete(_batch_run(args.outdir, args.seconds, Path(data_dir) / "batch"))
            else:
                if args.discover:
                    saved += loop.run_until_complete(
                        _discover(args.outdir, Path(data_dir) / "discover", size, tag, args.theme))
                if not args.lora_only:
                    saved += loop.run_until_complete(
                        _stream_main_window(args.outdir, args.seconds, Path(data_dir), size, args.theme, tag))
                if args.lora_only or not args.discover:
                    saved += loop.run_until_complete(
                        _stream_lora_chats(args.outdir, args.seconds, Path(data_dir) / "lora"))
                if not args.lora_only and not args.discover:
                    saved += loop.run_until_complete(_batch_run(args.outdir, args.seconds, Path(data_dir) / "batch"))
    for path in saved:
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
