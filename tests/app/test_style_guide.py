"""The style guide page is what the code gives: its tokens, colours and contrast ratios are not typed by hand."""
from tools.docs import style_guide


def test_style_guide_page_is_written_from_the_code(qapp):
    assert style_guide.PAGE.read_text() == style_guide.generate(), \
        "docs/app/style-guide.md is out of date: run python -m tools.docs.style_guide"


def test_style_guide_ratios_are_the_computed_ones(qapp):
    from app.preferences.contrast import contrast
    from app.preferences.design_tokens import ROLE_COLOURS
    from app.preferences.theme import dark_palette
    from PySide6.QtGui import QPalette

    text = dark_palette().color(QPalette.ColorRole.Text).getRgb()[:3]
    ratio = contrast(text, ROLE_COLOURS["dark"].user_bubble)
    assert f"{ratio:.2f}:1" in style_guide.generate().split("### Dark theme")[1]
