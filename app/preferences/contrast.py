"""WCAG 2.x contrast: the ratio between two colours and the nearest shade of a colour that reads on a background.

Text must reach 4.5:1 against what it is drawn on (WCAG AA). Colours that come from elsewhere (a Pygments
style's token colours, made for its own background rather than the transcript's code block) are moved to
the nearest shade of the same hue that does: darker on a light background, lighter on a dark one, so the
highlighting keeps its look. Qt-free: colours are (r, g, b) tuples of 0..255.
"""
from __future__ import annotations

AA = 4.5  # WCAG AA minimum for normal-size text

RGB = tuple[float, float, float]


def luminance(rgb: RGB) -> float:
    """WCAG relative luminance of an sRGB colour."""
    def linear(v: float) -> float:
        v /= 255
        return v / 12.92 if v <= 0.04045 else ((v + 0.055) / 1.055) ** 2.4
    r, g, b = (linear(v) for v in rgb[:3])
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


def contrast(a: RGB, b: RGB) -> float:
    """WCAG contrast ratio of two colours, 1 (same) to 21 (black on white)."""
    hi, lo = sorted((luminance(a), luminance(b)), reverse=True)
    return (hi + 0.05) / (lo + 0.05)


def over(top: RGB, alpha: float, below: RGB) -> RGB:
    """`top` drawn with opacity `alpha` (0..1) over `below`."""
    return tuple(alpha * t + (1 - alpha) * b for t, b in zip(top[:3], below[:3]))


def readable(fg: tuple[int, int, int], bg: RGB, minimum: float = AA) -> tuple[int, int, int]:
    """`fg` itself if it reaches `minimum` against `bg`, else the least mix of it toward black (on a light
    background) or white (on a dark one) that does: the same hue, just darker or lighter."""
    fg = tuple(int(v) for v in fg[:3])
    if contrast(fg, bg) >= minimum:
        return fg
    end = (0, 0, 0) if luminance(bg) > 0.18 else (255, 255, 255)  # 0.18: where black and white contrast alike
    for step in range(1, 101):
        t = step / 100
        shade = tuple(round(f + t * (e - f)) for f, e in zip(fg, end))
        if contrast(shade, bg) >= minimum:
            return shade
    return end
