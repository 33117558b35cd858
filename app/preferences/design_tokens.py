"""The app's design system in one place: spacing, type scale, corner radius, icon size and the colours of
message roles in both themes.

Widgets take their margins, gaps and text sizes from here rather than from pixel numbers of their own, so
the chat views line up on one 4 px grid and use one type scale. `stylesheet()` turns the tokens into the
Qt style sheet of the widgets that draw them (the message action bar, the empty chat); the docs' style
guide (`python -m tools.style_guide`) is written from the same values, so it cannot drift from the code.
"""
from __future__ import annotations

from dataclasses import dataclass

# Spacing: a 4 px grid (2 px for hairline gaps inside a control).
SPACE = {"xxs": 2, "xs": 4, "sm": 8, "md": 12, "lg": 16, "xl": 24, "xxl": 32}
# Type scale: sizes as a factor of the app's body font (the user's font size preference sets the body).
TYPE = {"caption": 0.85, "body": 1.0, "subtitle": 1.15, "title": 1.5}
RADIUS = {"sm": 4, "md": 8}
ICON = 16  # px: every icon of the bundled set is drawn on a 16 px grid

RGB = tuple[int, int, int]


@dataclass(frozen=True)
class RoleColours:
    """What a theme paints behind and on a message, and on the chrome around the transcript."""
    user_bubble: RGB  # background of the user's messages
    assistant_bubble: RGB  # background of the assistant's messages (the transcript's own Base)
    role_label: RGB  # "You" / "Assistant" over each message
    chip: RGB  # background of the action bar, example prompts and presets in the empty chat
    chip_border: RGB
    chip_text: RGB
    chip_checked: RGB  # a chosen preset


# Light: Fusion's light palette (white Base, black text). Dark: app.preferences.theme's dark palette.
ROLE_COLOURS = {
    "light": RoleColours(user_bubble=(235, 242, 252), assistant_bubble=(255, 255, 255), role_label=(32, 86, 140),
                         chip=(246, 247, 249), chip_border=(200, 204, 210), chip_text=(30, 30, 30),
                         chip_checked=(208, 225, 247)),
    "dark": RoleColours(user_bubble=(40, 52, 70), assistant_bubble=(30, 30, 32), role_label=(140, 190, 245),
                        chip=(48, 49, 54), chip_border=(78, 80, 88), chip_text=(225, 225, 225),
                        chip_checked=(44, 70, 106)),
}


def roles(dark: bool) -> RoleColours:
    return ROLE_COLOURS["dark" if dark else "light"]


def css(rgb: RGB) -> str:
    return "#%02x%02x%02x" % rgb


def stylesheet(dark: bool) -> str:
    """The style sheet of the widgets drawn from the tokens (selected by object name, so nothing else changes)."""
    c = roles(dark)
    s, r = SPACE, RADIUS
    return f"""
QFrame#messageActions {{ background: {css(c.chip)}; border: 1px solid {css(c.chip_border)};
    border-radius: {r['sm']}px; }}
QToolButton#messageAction {{ border: none; border-radius: {r['sm']}px; padding: {s['xxs']}px; }}
QToolButton#messageAction:hover, QToolButton#messageAction:focus {{ background: {css(c.chip_border)}; }}
QWidget#emptyState QLabel#emptyTitle {{ color: {css(c.role_label)}; }}
QWidget#emptyState QPushButton {{ background: {css(c.chip)}; color: {css(c.chip_text)};
    border: 1px solid {css(c.chip_border)}; border-radius: {r['md']}px; padding: {s['xs']}px {s['md']}px;
    text-align: left; }}
QWidget#emptyState QPushButton:checked {{ background: {css(c.chip_checked)}; border-color: {css(c.role_label)}; }}
QWidget#emptyState QPushButton:hover, QWidget#emptyState QPushButton:focus {{ border-color: {css(c.role_label)}; }}
"""
