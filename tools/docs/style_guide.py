"""The docs' style guide page from the code: `python -m tools.docs.style_guide [docs/app/style-guide.md] [--check]`.

Every number on the page is read from the design tokens (app.preferences.design_tokens), the themes'
palettes (app.preferences.theme) and the icon set (app.preferences.icons); the contrast ratios are computed
by app.preferences.contrast. `--check` exits 1 if the page differs from what the code gives now (the tests
run it), so the page cannot drift from the code.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Sequence

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "app" / "style-guide.md"

INTRO = """# Style guide

The app's look comes from one module of design tokens (`app/preferences/design_tokens.py`): one spacing
scale, one type scale, one corner radius and icon size, and the colours of the message roles in each theme.
The chat views and the style sheet of the widgets that draw them take their sizes and colours from there.
This page is written from the code by `python -m tools.docs.style_guide`; a test fails if it falls out of date.
"""


def _swatch(rgb) -> str:
    hexa = "#%02x%02x%02x" % tuple(int(v) for v in rgb[:3])
    return f'<span style="display:inline-block;width:1em;height:1em;background:{hexa};border:1px solid #888;' \
           f'vertical-align:middle"></span> `{hexa}`'


def generate() -> str:
    """The page's Markdown (needs a QApplication: the palettes come from Qt's styles)."""
    from PySide6.QtGui import QPalette

    from app.preferences import icons
    from app.preferences.contrast import AA, contrast
    from app.preferences.design_tokens import ICON, RADIUS, ROLE_COLOURS, SPACE, TYPE
    from app.preferences.theme import dark_palette, light_palette

    out = [INTRO, "## Spacing", "", "A 4 px grid; 2 px only for hairline gaps inside a control.", "",
           "| token | px |", "| --- | --- |"]
    out += [f"| `{k}` | {v} |" for k, v in SPACE.items()]
    out += ["", "## Type scale", "", "Sizes are factors of the body font (the font size set in Preferences).", "",
            "| token | × body | at a 10 pt body |", "| --- | --- | --- |"]
    out += [f"| `{k}` | {v:g} | {10 * v:.1f} pt |" for k, v in TYPE.items()]
    out += ["", "## Corners and icons", "", "| token | px |", "| --- | --- |"]
    out += [f"| radius `{k}` | {v} |" for k, v in RADIUS.items()] + [f"| icon size | {ICON} |"]
    R = QPalette.ColorRole
    palettes = {"light": light_palette(), "dark": dark_palette()}
    out += ["", "## Colours", "",
            f"Every text colour reaches WCAG AA ({AA}:1) on what it is drawn on, in both themes "
            "(tests/app/test_contrast.py and tests/app/test_look.py check each pair).", ""]
    for theme, p in palettes.items():
        c = ROLE_COLOURS[theme]
        rgb = lambda role: p.color(role).getRgb()[:3]  # noqa: E731
        pairs = [
            ("body text on the transcript", rgb(R.Text), rgb(R.Base)),
            ("text on a panel", rgb(R.WindowText), rgb(R.Window)),
            ("text on the user's bubble", rgb(R.Text), c.user_bubble),
            ("link on the user's bubble", rgb(R.Link), c.user_bubble),
            ("role label (You / Assistant) on the transcript", c.role_label, rgb(R.Base)),
            ("role label on the user's bubble", c.role_label, c.user_bubble),
            ("action bar / example prompt text", c.chip_text, c.chip),
            ("chosen preset", c.chip_text, c.chip_checked),
            ("selected text", rgb(R.HighlightedText), rgb(R.Highlight)),
        ]
        out += [f"### {theme.capitalize()} theme", "", "| pair | text | background | contrast |",
                "| --- | --- | --- | --- |"]
        out += [f"| {name} | {_swatch(fg)} | {_swatch(bg)} | {contrast(fg, bg):.2f}:1 |" for name, fg, bg in pairs]
        out.append("")
    out += ["## Icons", "",
            "One set: the desktop theme's icons where it has all of them, else these (line icons on a "
            f"{ICON} px grid in `resources/icons/actions/`, tinted with the theme's text colour).", "",
            "| icon | name | desktop theme name |", "| --- | --- | --- |"]
    for name, theme_name in icons.THEME_NAMES.items():
        svg = icons.svg(name).strip().replace("\n", "")
        out.append(f"| {svg} | `{name}` | `{theme_name}` |")
    out += ["", "## Screenshots", "",
            "Made by `python -m tools.screenshots.look resources/screenshots --size 1366x768 [--theme dark]`.", ""]
    for theme in ("", "-dark"):
        label = "dark" if theme else "light"
        out += [f"![A new chat's start page, {label} theme: the model, the presets and example prompts]"
                f"(../screenshots/app-empty-chat-1366x768{theme}.png)", "",
                f"![A reply with its action buttons shown on hover, {label} theme]"
                f"(../screenshots/app-message-actions-1366x768{theme}.png)", ""]
    return "\n".join(out).rstrip() + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Write (or check) the style guide page from the code.")
    parser.add_argument("page", nargs="?", type=Path, default=PAGE)
    parser.add_argument("--check", action="store_true", help="exit 1 if the page is not what the code gives")
    args = parser.parse_args(argv)
    from PySide6.QtWidgets import QApplication

    QApplication.instance() or QApplication(sys.argv[:1])
    text = generate()
    if args.check:
        if not args.page.exists() or args.page.read_text() != text:
            print(f"{args.page} is out of date: run python -m tools.docs.style_guide", file=sys.stderr)
            return 1
        return 0
    args.page.write_text(text)
    print(args.page)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
