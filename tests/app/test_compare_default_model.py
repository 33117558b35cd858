"""Compare mode with the real default model (SmolLM2-135M) in the real window: four panes with their
own sampler settings and one pinned document; the shared prefix (document + system prompt) is computed
once: every follower's prompt pages are the leader's page ids and its reply reports them as cached."""
from dataclasses import replace

import pytest

from app.core.store import ChatSettings
from tests.app.support import loop, make_window, run, store, wait_until  # noqa: F401

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

GUIDE = ("Harbour guide. " + " ".join(f"Pier {i} has a ferry every {i + 10} minutes and a café that opens at {i % 5 + 6}."
                                      for i in range(40)))


def test_four_panes_share_the_document_and_system_prompt_pages(qtbot, loop, store, tmp_path):
    from app.local.engine_service import EngineService

    async def body():
        service = EngineService()
        errors = []
        service.load_failed.connect(errors.append)
        assert await service.load({"cache_tokens": 8192}), errors
        jobs = {}
        real_start = service.start_job

        def start_job(identifier, history, settings):
            job, n = real_start(identifier, history, settings)
            jobs[identifier] = job
            return job, n
        service.start_job = start_job
        window = make_window(qtbot, store, service)
        base = ChatSettings(max_new_tokens=8, stop_on_loops=False)
        looks = [replace(base, temperature=0.0), replace(base, seed=1), replace(base, seed=2, temperature=1.2),
                 replace(base, seed=3, top_k=5)]
        panes = [window.new_chat(f"look {i}") for i in range(4)]
        for pane, s in zip(panes, looks):
            pane.session.set_settings(s)
        window.chats.show_side_by_side(panes)
        window.chats.set_compare(True)
        doc = tmp_path / "guide.txt"
        doc.write_text(GUIDE)
        bar = window.chats.compare
        assert bar.pin_document(str(doc)) == 4, bar.message.text()
        pages = {}

        def record() -> bool:
            for cid, job in jobs.items():
                if job.job.seqs[0].pages and cid not in pages:
                    pages[cid] = [p.index for p in job.job.seqs[0].pages]
            return all(not p.session.running and len(p.session.messages) == 2 for p in panes)

        bar.send("Which pier has the earliest café?")
        await wait_until(record, 500, "four replies")
        stats = [p.session.messages[1].stats for p in panes]
        assert all(s.state == "done" for s in stats), [s.error for s in stats]
        assert len({s.prompt_tokens for s in stats}) == 1 and stats[0].prompt_tokens > 3 * 256
        full = (stats[0].prompt_tokens - 1) // 256
        leader = pages[panes[0].session.chat_id][:full]
        assert stats[0].cached_tokens == 0
        for pane, s in zip(panes[1:], stats[1:]):
            assert pages[pane.session.chat_id][:full] == leader  # the very same cache pages
            assert s.cached_tokens >= full * 256  # reported as cached tokens: read once, by the leader
        await service.close()

    run(loop, body(), 560)
