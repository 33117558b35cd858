"""The dashboard's expert map live: `python -m tools.screenshots.expert_map OUTDIR [--size WxH] [--model FOLDER]`.

Opens the real main window (offscreen, or under Xvfb: `xvfb-run -s "-screen 0 1366x768x24"`) on a scratch
history with a mixture-of-experts model, tiles two chats, sends both, and grabs the window mid-stream with the
pointer resting on the first chat's pane, so the map shows that chat's routing over the other's:
app-expert-map-<size>[-dark].png (--theme dark). With no --model it builds a tiny random Qwen3-MoE (tests.tiny_models, the test
extras: 8 sparse layers of 32 experts, 4 a token); its replies are random tokens, and the chats' titles say so.
"""
from __future__ import annotations

import argparse
import asyncio
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Sequence

from tools.screenshots._session import qt_session, save_grab, screen_size, until_streamed

SMALL_CACHE = 16 * 256  # 16 pages: big cells on the page map above the expert map


def tiny_moe(folder: Path) -> Path:
    """A tiny random Qwen3-MoE folder: enough layers and experts for a map that reads as one."""
    from tests.tiny_models import write_tiny_model

    return write_tiny_model(folder, "qwen3moe", tie=False, seed=11, num_hidden_layers=8, mlp_only_layers=[],
                            num_experts=32, num_experts_per_tok=4)


async def expert_map_shot(outdir: Path, data_dir: Path, size: tuple[int, int], seconds: float,
                          model: Path | None = None, theme: str = "light") -> Path:
    from PySide6.QtCore import QPoint, Qt
    from PySide6.QtGui import QCursor

    from app.window.main_window import MainWindow

    tiny = model is None
    with tempfile.TemporaryDirectory(prefix="pagedeck-tiny-moe-") as scratch:
        model = tiny_moe(Path(scratch) / "tiny-random-qwen3moe") if tiny else model
        window = MainWindow(data_dir=data_dir, load_request={"path": str(model), "cache_tokens": SMALL_CACHE})
        window.theme.set_mode(theme)
        window.show()
        window.resize(*size)
        try:
            if not await window.loader.ready():
                raise SystemExit(f"model did not load: {window.status.last_error}")
            label = " · tiny random MoE" if tiny else ""  # its replies are noise: say so on the tile
            panes = [window.new_chat(f"{name}{label}") for name in ("Harbour", "Lighthouse")]
            window.chats.show_side_by_side(panes)
            window.dashboard.raise_()
            window.resizeDocks([window.dashboard], [max(360, size[0] // 3)], Qt.Orientation.Horizontal)
            for n, (pane, question) in enumerate(zip(panes, ("What should a visitor to the harbour do first?",
                                                             "Why does a lighthouse need a keeper?"))):
                pane.session.set_settings(replace(pane.session.settings, max_new_tokens=400, seed=n))
                pane.prompt.setPlainText(question)
            for pane in panes:
                pane.submit()
            await until_streamed([p.session for p in panes], 300, seconds)
            expert_map = window.dashboard.expert_map
            if not expert_map.isVisible():
                raise SystemExit(f"{model}: the dashboard shows no expert map (not a mixture-of-experts model?)")
            first = panes[0]
            QCursor.setPos(first.mapToGlobal(QPoint(40, first.height() // 2)))  # hover the first chat's pane
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 5
            while expert_map.chat != first.session.chat_id and loop.time() < deadline:
                await asyncio.sleep(0.05)
            if expert_map.chat != first.session.chat_id:
                raise SystemExit("the expert map did not follow the hovered pane; no screenshot taken")
            await asyncio.sleep(0.3)  # the next snapshot painted
            dark = "-dark" if theme == "dark" else ""
            return save_grab(window, outdir / f"app-expert-map-{size[0]}x{size[1]}{dark}.png")
        finally:
            await window.shutdown()
            window.close()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Save a screenshot of the dashboard's expert map, live.")
    parser.add_argument("outdir", type=Path)
    parser.add_argument("--size", type=screen_size, default=(1366, 768), help="window size WxH (1366x768)")
    parser.add_argument("--model", type=Path, help="a mixture-of-experts model (default: a tiny random Qwen3-MoE)")
    parser.add_argument("--theme", choices=("light", "dark"), default="light")
    parser.add_argument("--seconds", type=float, default=120.0, help="the longest to wait for the replies")
    args = parser.parse_args(argv)
    args.outdir.mkdir(parents=True, exist_ok=True)
    with qt_session("pagedeck-expert-map-") as (loop, data_dir):
        print(loop.run_until_complete(expert_map_shot(args.outdir, data_dir, args.size, args.seconds, args.model,
                                                      args.theme)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
