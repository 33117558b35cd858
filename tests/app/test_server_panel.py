"""Server panel and remote mode in the real window (pytest-qt, qasync, tiny random model, real HTTP).

The Server panel serves the window's own generator: an API request and a chat run in one batch and
the API job shows on the page map under its request id. Remote mode points the chats at another
server (here a second pagedeck server): replies stream with stats, Stop frees the remote job, the
dashboard draws the remote's page map, and errors (server down, wrong key, unknown adapter) are shown.
"""
import asyncio
import json
import socket
import urllib.error
import urllib.request

import openai
import pytest
from PySide6.QtCore import Qt

from app.core.store import ChatSettings
from tests.server_support import ServerThread
from tests.app.test_chat import _type_and_enter as send
from tests.app.support import loaded_service, loop, make_window, run, store, tiny_model, wait_until  # noqa: F401

pytestmark = pytest.mark.timeout(300)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def read(url: str) -> str:
    """GET off the event loop's thread (the server answers on that loop)."""
    with urllib.request.urlopen(url, timeout=60) as r:
        return r.read().decode()


@pytest.fixture(scope="module")
def long_context_model(tmp_path_factory):
    """The tiny Llama with a 4096-token context, so that the chat runs far longer than the API request beside
    it (the test stops it): in the shared model's 512 tokens a reply ends within about a second, too close to
    the request's own time for a machine that stalls."""
    from tests.tiny_models import write_tiny_model

    return write_tiny_model(tmp_path_factory.mktemp("tiny-4k") / "llama", arch="llama", max_position_embeddings=4096)


def test_server_panel_serves_the_apps_generator_next_to_the_chats(qtbot, loop, store, long_context_model):
    async def body():
        win = make_window(qtbot, store, await loaded_service(long_context_model))
        panel = win.server_panel
        port = free_port()
        panel.port_spin.setValue(port)
        panel.key_edit.setText("k3y")
        qtbot.mouseClick(panel.start_button, Qt.MouseButton.LeftButton)
        await wait_until(lambda: win.local_server.running, 30, "the server to start")
        assert f"127.0.0.1:{port}/v1" in panel.status_label.text() and panel.start_button.text() == "Stop"
        assert not panel.port_spin.isEnabled()

        pane = win.new_chat("local chat")
        pane.session.set_settings(ChatSettings(max_new_tokens=3000))
        send(qtbot, pane, "keep talking")
        await wait_until(lambda: win.service.snapshot()["active_jobs"] == 1, what="the chat to run")
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="k3y", max_retries=0)
        api_ids = set()

        def stream():
            chunks = list(client.chat.completions.create(model=win.local_server.server.served.name, max_tokens=200,
                                                         messages=[{"role": "user", "content": "hi"}], stream=True))
            return chunks

        call = asyncio.ensure_future(asyncio.to_thread(stream))
        while not call.done():
            snap = win.service.snapshot()
            api_ids |= {v for v in snap["page_owner_identifiers"].values() if isinstance(v, str)}
            await asyncio.sleep(0.005)
        chunks = call.result()
        snap = win.service.snapshot()
        assert snap["active_jobs"] == 1, "the chat ended before the API request did"
        # the generator's own record of its largest step: the request and the chat in one batch
        assert snap["batch_size_peak"] == 2, "the API request did not run in the same batch as the chat"
        assert chunks[0].id in api_ids  # on the page map under its request id
        assert "1 requests (0 running)" in panel.status_label.text()
        with pytest.raises(openai.AuthenticationError):
            await asyncio.to_thread(lambda: openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="nope",
                                                          max_retries=0).models.list())
        await pane.session.stop()

        qtbot.mouseClick(panel.start_button, Qt.MouseButton.LeftButton)
        await wait_until(lambda: not win.local_server.running, 30, "the server to stop")
        with pytest.raises(urllib.error.URLError):
            await asyncio.to_thread(urllib.request.urlopen, f"http://127.0.0.1:{port}/health", timeout=5)
        assert "Not serving" in panel.status_label.text()

        with socket.socket() as busy:  # a port in use is reported in the panel
            busy.bind(("127.0.0.1", 0))
            busy.listen()
            panel.port_spin.setValue(busy.getsockname()[1])
            await panel.toggle()
            assert panel.error_label.isVisible() and "Could not listen" in panel.error_label.text()
            assert not win.local_server.running
        await win.shutdown()

    run(loop, body(), 240)


def test_server_panel_serves_the_generators_adapters_and_follows_model_reloads(qtbot, loop, store, tiny_model,
                                                                              tmp_path):
    """One registry: what the LoRA panel loads is served, what a client loads the panel shows."""
    from tests.engine.test_lora import write_peft_adapter
    from tests.engine.test_server import post

    ada = write_peft_adapter(tiny_model, tmp_path / "ada", seed=3)
    bob = write_peft_adapter(tiny_model, tmp_path / "bob", seed=4, targets=["q_proj", "v_proj"])

    async def body():
        win = make_window(qtbot, store, await loaded_service(tiny_model))
        assert await win.local_server.start("127.0.0.1", 0, None)
        url = win.local_server.url

        async def ids():
            return [m["id"] for m in json.loads(await asyncio.to_thread(read, url + "/v1/models"))["data"]]

        base = (await ids())[0]
        assert await ids() == [base]  # nothing loaded yet: listed adapters on disk are not models
        assert await win.service.load_adapter(ada)  # what the LoRA panel's "loaded" column does
        assert await ids() == [base, "ada"]
        status, _ = await asyncio.to_thread(post, url + "/v1/load_lora_adapter", {"lora_name": "bob", "lora_path": str(bob)})
        assert status == 200
        await wait_until(lambda: win.lora_panel.loaded() == ["ada", "bob"], what="the panel to show the API's load")
        old = win.local_server.server.served.generator
        assert await win.service.load({"path": str(tiny_model), "cache_tokens": 2048})
        assert win.local_server.server.served.generator is win.service.generator is not old
        # the new generator loads the same adapters again (the panel's and the API client's)
        assert await ids() == [base, "ada", "bob"] and win.lora_panel.loaded() == ["ada", "bob"]
        assert 'pagedeck:pages_total{model_name="llama"} 8.0' in await asyncio.to_thread(read, url + "/metrics")
        await win.shutdown()

    run(loop, body(), 200)


@pytest.fixture(scope="module")
def remote_server(tiny_model):
    with ServerThread(tiny_model, cache_tokens=2048, page_size=16, api_key="rk") as server:
        yield server


def test_remote_mode_streams_chats_with_stats_and_follows_the_remote_dashboard(qtbot, loop, store, tiny_model,
                                                                                remote_server):
    async def body():
        win = make_window(qtbot, store, await loaded_service(tiny_model))
        box = win.remote.box
        box.url_edit.setText(remote_server.url + "/v1")
        box.key_edit.setText("rk")
        qtbot.mouseClick(box.connect_button, Qt.MouseButton.LeftButton)
        await wait_until(lambda: win.remote.connected, 30, "the connection")
        assert remote_server.model_name in box.status_label.text() and "remote" in win.status.model_status.text()

        pane = win.new_chat("remote chat")
        pane.session.set_settings(ChatSettings(max_new_tokens=24, temperature=0.0, top_k=0, top_p=1.0,
                                               repetition_penalty=1.0, system_prompt=""))
        send(qtbot, pane, "What is the capital of France?")
        await wait_until(lambda: not pane.session.running, 60, "the remote reply")
        reply = pane.session.messages[-1]
        s = reply.stats
        assert s.state == "done" and s.new_tokens == 24 and s.eos_reason == "length" and s.prompt_tokens > 5
        assert s.ttft_s > 0 and s.tokens_per_s > 0
        assert win.service.snapshot()["tokens_generated_total"] == 0  # nothing ran on the local model
        first = reply.content
        await pane.session.regenerate()
        await wait_until(lambda: not pane.session.running, 60, "the regenerated reply")
        assert pane.session.messages[-1].content == first  # greedy: the same answer again

        pane.session.set_settings(ChatSettings(max_new_tokens=400, system_prompt=""))
        send(qtbot, pane, "Now go on for a long time.")
        await wait_until(lambda: win.dashboard.snapshot is not None and win.dashboard.snapshot.get("server") == "pagedeck"
                         and any(st >= 0 for st in win.dashboard.snapshot["page_states"]), 60,
                         "the remote's page map in the dashboard")
        assert win.dashboard.page_map.isVisible() and not win.dashboard.kv_bar.isVisible()
        qtbot.keyClick(pane.prompt, Qt.Key.Key_Escape)
        await wait_until(lambda: not pane.session.running, 30, "stop")
        assert pane.session.messages[-1].stats.state == "stopped"
        await wait_until(lambda: remote_server.snapshot()["pages_referenced"] == 0, 30, "the remote job to end")

        await win.remote.disconnect()
        assert win.backend.current is win.service and not win.remote.connected
        await win.shutdown()

    run(loop, body(), 240)


def test_remote_errors_are_shown_never_raised(qtbot, loop, store, tiny_model, remote_server):
    async def body():
        win = make_window(qtbot, store, await loaded_service(tiny_model))
        assert not await win.remote.connect(f"http://127.0.0.1:{free_port()}")
        assert "Could not connect" in win.remote.box.error_label.text() and not win.remote.connected
        assert not await win.remote.connect(remote_server.url, "wrong-key")
        assert "HTTP 401" in win.remote.box.error_label.text()
        assert await win.remote.connect(remote_server.url, "rk")
        lora = win.remote.lora_panel
        assert not await win.remote.load_adapter("ghost", "/no/such/adapter")
        assert lora.error_label.isVisible() and "HTTP 404" in lora.error_label.text()
        assert not await win.remote.unload_adapter("ghost")
        win.remote.backend.model = "ghost"  # a model the server doesn't have: the chat shows the 404
        pane = win.new_chat("ghost chat")
        send(qtbot, pane, "hello?")
        await wait_until(lambda: not pane.session.running, 30, "the failed reply")
        stats = pane.session.messages[-1].stats
        assert stats.state == "error" and "HTTP 404" in stats.error and "ghost" in stats.error
        assert "HTTP 404" in pane.view.toPlainText()
        await win.shutdown()

    run(loop, body(), 200)


def test_the_stopped_server_panel_keeps_its_parts_together_at_the_top(qtbot, store):
    """Not serving (the models' table hidden), the spare height goes below the panel's parts, not between
    them: Start sits under the form and the status under Start, however tall the dock."""
    from app.panels.server_panel import ServerPanel

    win = make_window(qtbot, store)
    panel = ServerPanel(win.local_server)  # on its own, as tall as a dock on a 1366x768 screen
    qtbot.addWidget(panel)
    panel.resize(340, 700)
    panel.show()
    qtbot.waitExposed(panel)
    line = panel.fontMetrics().lineSpacing()
    start, status, last_field = panel.start_button, panel.status_label, panel.ttl_spin
    assert not panel.table.isVisible()
    assert start.geometry().top() - last_field.geometry().bottom() < 2 * line, (start.geometry(), last_field.geometry())
    assert status.geometry().top() - start.geometry().bottom() < 2 * line, (status.geometry(), start.geometry())
