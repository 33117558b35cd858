"""The model panel's list of models found on disk (app.panels.model_browser) with real Qt widgets and a real scan
of a fake home (the layouts of tests/test_discovery.py)."""

import pytest
from PySide6.QtCore import Qt

from app.panels.model_browser import COLUMNS, ModelBrowser
from app.panels.model_panel import ModelPanel
from engine.model.catalog import discovery
from engine.model.catalog import memory
from tests.engine.test_discovery import home  # noqa: F401  (the fake home fixture)


@pytest.fixture
def panel(qtbot, home, tmp_path, monkeypatch):  # noqa: F811
    monkeypatch.setattr(memory, "available_bytes", lambda device="cpu": 16 << 30)

    def finder(folders, **options):
        return discovery.find_models(folders, env={}, home=home, **options)

    browser = ModelBrowser(tmp_path / "folders.json", finder=finder)
    panel = ModelPanel(tmp_path / "recent.json", browser=browser, cache_tokens=4096)
    qtbot.addWidget(panel)
    qtbot.waitUntil(lambda: not browser.scanning and browser.tree.topLevelItemCount() > 0, timeout=60000)
    return panel


def rows(browser):
    tree = browser.tree
    return {tree.topLevelItem(i).text(0): tree.topLevelItem(i) for i in range(tree.topLevelItemCount())}


def test_lists_found_models_with_facts_and_greys_unsupported(panel):
    browser = panel.browser
    found = rows(browser)
    ok = found["tinyllama:latest"]
    assert [ok.text(i) for i in (1, 2, 4, 6)] == ["Ollama", "llama", "Q8_0", "yes"]
    assert ok.text(3).endswith("M") and "MiB" in ok.text(5)
    assert ok.flags() & Qt.ItemIsEnabled
    moe = found["acme/moe"]
    assert not moe.flags() & Qt.ItemIsEnabled and "mixture-of-experts" in moe.toolTip(0)
    assert "usable" in browser.status.text() and len(COLUMNS) == 7


def test_choosing_a_model_fills_the_panel_and_shows_its_estimate(panel):
    browser = panel.browser
    item = rows(browser)["tinyorg/tiny-llama"]
    browser.tree.setCurrentItem(item)
    assert panel.path_edit.text() == item.data(0, Qt.UserRole) and panel.path_edit.text().endswith("abc123")
    assert browser.estimate_label.text().startswith("Fits: it needs") and "4,096 tokens" in browser.estimate_label.text()
    panel.cache_spin.setValue(65536)  # the panel's choices drive the estimate
    assert "65,536 tokens" in browser.estimate_label.text()
    assert panel.request()["path"] == item.data(0, Qt.UserRole)


def test_a_model_that_will_not_fit_says_why(panel, monkeypatch):
    monkeypatch.setattr(memory, "available_bytes", lambda device="cpu": 300 << 20)
    browser = panel.browser
    panel.cache_spin.setValue(8192)  # re-estimates with the new (tiny) free memory
    item = rows(browser)["tinyllama:latest"]
    assert item.text(6) == "no"
    browser.tree.setCurrentItem(item)
    assert "will not fit" in browser.estimate_label.text() and "Try" in browser.estimate_label.text()


def test_added_folders_are_scanned_and_remembered(panel, qtbot, tmp_path, home):  # noqa: F811
    import shutil

    added = tmp_path / "more"
    added.mkdir()
    src = next(home.joinpath(".lmstudio").rglob("tiny-Q8_0.gguf"))
    shutil.copy(src, added / "copy-of-tiny.gguf")
    browser = panel.browser
    browser.add_folder(str(added))
    qtbot.waitUntil(lambda: not browser.scanning, timeout=60000)
    assert "copy-of-tiny.gguf" in rows(browser)  # "-of-" in a name is not a split file's part number
    assert rows(browser)["copy-of-tiny.gguf"].text(1) == discovery.ADDED
    assert ModelBrowser(tmp_path / "folders.json", autoscan=False).added_folders == [str(added)]


def test_the_estimate_names_the_peak_of_loading(panel):
    from engine import estimate_memory
    from engine.model.catalog.memory import _gib

    browser = panel.browser
    item = rows(browser)["tinyllama:latest"]
    browser.tree.setCurrentItem(item)
    est = estimate_memory(item.data(0, Qt.UserRole), cache_tokens=4096)
    assert est.load_peak_bytes > est.weights_bytes
    assert f"loading peaks at ~{_gib(est.load_peak_bytes)}" in browser.estimate_label.text()


def test_the_scan_status_reads_on_one_line_in_a_narrow_dock(panel, qtbot):
    """At the dock's width on a 1366x768 screen (~340 px) the status ("N models found, M usable") keeps a line of
    its own rather than wrapping a word a line beside the buttons."""
    panel.resize(340, 700)
    panel.show()
    qtbot.waitExposed(panel)
    status = panel.browser.status
    assert status.text().endswith("usable")
    assert status.height() < 2 * status.fontMetrics().lineSpacing(), (status.text(), status.height())


def test_nothing_found_says_what_there_is_and_where_to_get_more(qtbot, tmp_path):
    """A first start finds nothing on disk: the list says the embedded model is there all the same and where
    more come from, rather than "0 models found, 0 usable"."""
    browser = ModelBrowser(tmp_path / "folders.json", finder=lambda folders, **options: [])
    qtbot.addWidget(browser)
    qtbot.waitUntil(lambda: not browser.scanning, timeout=60000)
    text = browser.status.text()
    assert "embedded default" in text and "Discover" in text and "Add folder" in text, text
