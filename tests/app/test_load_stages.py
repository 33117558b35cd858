"""The Model tab shows a model load's stages (header, weights, tokenizer) as the engine reports them: the
weights' share while they load, each stage's seconds once done, and the summary stays after the load. The
reports come from the loading threads and reach the widgets on the UI thread. Real window, real tiny GGUF."""
import re
import threading

import pytest

from tests.app.support import TINY_CACHE_TOKENS, loop, make_window, run, store  # noqa: F401

SUMMARY = re.compile(r"^header \d+\.\d\d s · weights \d+\.\d\d s · tokenizer \d+\.\d\d s$")


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    from tools.models.synthetic_gguf import write_random_gguf

    return write_random_gguf(tmp_path_factory.mktemp("stages") / "tiny.gguf", "tiny", 4, "Q8_0")


def test_loading_a_model_shows_each_stage_and_keeps_the_summary(qtbot, loop, store, tiny_gguf):  # noqa: F811
    async def body():
        win = make_window(qtbot, store)
        stages = win.model_panel.stages
        shown, threads = [], set()

        def seen(report) -> None:
            threads.add(threading.current_thread())
            shown.append(stages.text())

        win.service.load_report.connect(seen)  # connected after the panel's slot: sees the label it left
        assert await win.loader.load_model({"path": str(tiny_gguf), "cache_tokens": TINY_CACHE_TOKENS})
        assert threads == {threading.main_thread()}  # posted to the UI thread by the service
        assert shown[0] == "header…"
        # the weights' share while loading (its rises come every 50 ms while the bytes move: a tiny model's
        # take less, so only its start is certain here; test_a_weights_report_shows_its_share below)
        assert any(re.search(r"^header \d+\.\d\d s · weights 0%", text) for text in shown)
        assert SUMMARY.match(stages.text()), stages.text()
        assert not stages.isHidden() and not win.model_panel.loading
        await win.service.close()

    run(loop, body())


def test_a_weights_report_shows_its_share_then_the_stage_its_seconds(qtbot):
    from app.panels.load_stages import LoadStages
    from engine.contract import LoadProgress

    stages = LoadStages()
    qtbot.addWidget(stages)
    stages.show_report(LoadProgress("header", 1.0, 0.02, done=True))
    stages.show_report(LoadProgress("weights", 0.43, 0.2))
    stages.show_report(LoadProgress("tokenizer", 0.0, 0.0))
    assert stages.text() == "header 0.02 s · weights 43% · tokenizer…"
    stages.show_report(LoadProgress("weights", 1.0, 0.61, done=True))
    stages.show_report(LoadProgress("tokenizer", 1.0, 0.35, done=True))
    assert SUMMARY.match(stages.text()) and "weights 0.61 s" in stages.text()
