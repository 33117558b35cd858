"""Render resources/icons/pagedeck.svg to the PNG sizes shipped beside it (desktop menus and the window
icon use PNGs, so they show even where Qt's SVG plugin or an SVG icon loader is missing).

    python packaging/render_icons.py
"""
from __future__ import annotations

import sys
from pathlib import Path

ICONS = Path(__file__).resolve().parents[1] / "resources" / "icons"
SIZES = (16, 24, 32, 48, 64, 128, 256)


def main() -> int:
    from PySide6.QtCore import Qt
    from PySide6.QtGui import QGuiApplication, QImage, QPainter
    from PySide6.QtSvg import QSvgRenderer

    app = QGuiApplication.instance() or QGuiApplication(sys.argv[:1])  # noqa: F841 (QPainter needs it)
    renderer = QSvgRenderer(str(ICONS / "pagedeck.svg"))
    if not renderer.isValid():
        raise SystemExit(f"cannot read {ICONS / 'pagedeck.svg'}")
    for size in SIZES:
        image = QImage(size, size, QImage.Format.Format_ARGB32)
        image.fill(Qt.GlobalColor.transparent)
        painter = QPainter(image)
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        renderer.render(painter)
        painter.end()
        out = ICONS / f"pagedeck-{size}.png"
        if not image.save(str(out)):
            raise SystemExit(f"cannot write {out}")
        print(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
