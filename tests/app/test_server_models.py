"""The Server tab serves every model the app holds (the main one and one beside it) from the app's own
generators, in a live table: memory, chats and requests, idle unload and time left, pin and unload.

Real window, real tiny models, the official openai client over real HTTP: an API stream and an app chat
on the model beside the main one run in one step (that generator's batch-size peak reaches 2); the
table counts the idle time down, pinning stops it, a request's ttl unloads the model from the app, the
Unload button too; the main model can be neither unpinned nor unloaded. The status file `pagedeck ps`
reads says the same while a chat and a request run.
"""
import asyncio

import openai
import pytest

from app.core.running_app import read_running
from app.core.store import ChatSettings
from app.local.status_file import StatusFile
from tests.app.support import loaded_service, loop, make_window, run, store, tiny_model, wait_until  # noqa: F401
from tests.app.test_chat import _type_and_enter as send

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def second_model(tmp_path_factory):
    from tests.tiny_models import write_tiny_model

    return write_tiny_model(tmp_path_factory.mktemp("tiny2") / "qwen2", arch="qwen2", seed=5)


def rows(panel) -> list[list[str]]:
    """Each row's cell as its lines: name, memory and what runs on it, idle unload."""
    return [label.text().split("\n") for label in panel.row_labels]


def test_server_tab_serves_each_loaded_model_on_the_apps_generator(qtbot, loop, store, tiny_model, second_model,
                                                                  tmp_path):
    side = str(second_model)

    async def body():
        win = make_window(qtbot, store, await loaded_service(tiny_model))
        service, panel, server = win.service, win.server_panel, win.local_server
        assert await service.load_beside(side, cache_tokens=2048)
        assert await server.start("127.0.0.1", 0, None)
        assert not panel.table.isHidden()
        main_name, side_name = (r["name"] for r in server.models())
        side_gen = service.beside[side].generator
        got = rows(panel)
        assert [r[0] for r in got] == [f"{main_name} (main)", side_name]
        assert got[0][2] == "pinned: stays loaded" and got[1][2] == "no idle unload"  # until set
        memory = got[1][1].split(" · ")[0]
        assert memory.endswith("MiB") and memory != "0 MiB" and got[1][1].endswith("0 chats · 0 requests")
        assert panel.pin_buttons[side_name].accessibleName() == f"Pin {side_name}"
        assert panel.unload_buttons[side_name].accessibleName() == f"Unload {side_name}"
        assert not panel.unload_buttons[main_name].isEnabled() and not panel.pin_buttons[main_name].isEnabled()

        # an app chat and an API stream on the model beside the main one share its generator's batch
        pane = win.new_chat("side chat")
        pane.session.set_settings(ChatSettings(max_new_tokens=450, model=side))
        send(qtbot, pane, "keep talking")
        await wait_until(lambda: side_gen.metrics()["active_jobs"] == 1, what="the chat to run on the side model")
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
        status = StatusFile(tmp_path, service, server)
        seen = {"chats": 0, "requests": 0, "pages": 0}

        def stream():
            return list(client.chat.completions.create(model=side_name, max_tokens=40, stream=True,
                                                       messages=[{"role": "user", "content": "hi"}]))

        call = asyncio.ensure_future(asyncio.to_thread(stream))
        while not call.done():
            row = next(r for r in server.models() if r["name"] == side_name)
            if row["requests_running"] and row["chats"]:
                panel.refresh()
                assert rows(panel)[1][1].endswith(" · 1 chat · 1 request")  # the table counts both on that model
                status.write()
                m = read_running(tmp_path)["models"][1]
                seen = {"chats": m["chats_running"], "requests": m["requests_running"], "pages": m["pages_used"]}
            await asyncio.sleep(0.005)
        assert call.result()[0].model == side_name
        assert side_gen.metrics()["batch_size_peak"] == 2, "the API request did not batch with the chat"
        assert seen["chats"] == seen["requests"] == 1 and seen["pages"] > 0, seen
        await pane.session.stop()
        # the same on the main model: its chats and requests share the app's main generator
        main_pane = win.new_chat("main chat")
        main_pane.session.set_settings(ChatSettings(max_new_tokens=450))
        send(qtbot, main_pane, "keep talking")
        await wait_until(lambda: service.generator.metrics()["active_jobs"] == 1, what="the chat on the main model")
        await asyncio.to_thread(lambda: client.completions.create(model=main_name, prompt="a", max_tokens=20))
        assert service.generator.metrics()["batch_size_peak"] == 2, "the API request did not batch with the chat"
        await main_pane.session.stop()
        status.remove()
        assert read_running(tmp_path) is None

        # idle unload: the tab's setting counts down, a pin stops it, unpinning starts it again
        panel.ttl_spin.setValue(5)
        await wait_until(lambda: rows(panel)[1][2:] == ["idle unload after 5:00", "unloads in 5:00"],
                         what="the idle timer to show")
        await wait_until(lambda: rows(panel)[1][3].startswith("unloads in 4:5"), 10, "the time left to count down")
        assert rows(panel)[0][2] == "pinned: stays loaded"  # the main model never idles out
        panel.pin_buttons[side_name].click()
        assert rows(panel)[1][2:] == ["pinned: stays loaded"] and server.pool.models[side_name].timer is None
        assert panel.pin_buttons[side_name].accessibleName() == f"Unpin {side_name}"
        panel.pin_buttons[side_name].click()
        assert server.pool.models[side_name].timer is not None
        assert rows(panel)[1][2:] == ["idle unload after 5:00", "unloads in 5:00"]
        panel.pin(main_name, False)
        assert "stays pinned" in panel.error_label.text() and server.pool.models[main_name].pinned

        # a request's ttl of 0 unloads the model from the app as soon as it is idle: its requests and its
        # chats ended (a chat still running on it holds it)
        send(qtbot, pane, "keep talking")
        await wait_until(lambda: side_gen.metrics()["active_jobs"] == 1, what="the chat to run again")
        await asyncio.to_thread(lambda: client.completions.create(model=side_name, prompt="a", max_tokens=2,
                                                                  extra_body={"ttl": 0}))
        tokens = side_gen.metrics()["tokens_generated_total"]
        await wait_until(lambda: side_gen.metrics()["tokens_generated_total"] > tokens + 20, what="the chat to go on")
        assert side in service.beside and pane.session.running  # not unloaded under its chat
        await pane.session.stop()
        await wait_until(lambda: side not in service.beside, 30, "the ttl to unload the side model")
        await wait_until(lambda: [r[0] for r in rows(panel)] == [f"{main_name} (main)"], what="the row to go")
        with pytest.raises(openai.APIStatusError):
            await asyncio.to_thread(lambda: client.completions.create(model=side_name, prompt="a", max_tokens=2))

        # loaded again beside the main one: served at once; the Unload button unloads it from the app
        assert await service.load_beside(side, cache_tokens=2048)
        await wait_until(lambda: len(rows(panel)) == 2, what="the model to be served again")
        await panel.unload(side_name)
        assert side not in service.beside and len(rows(panel)) == 1
        await panel.unload(main_name)
        assert "stays loaded" in panel.error_label.text() and service.generator is not None
        await server.stop()
        assert panel.table.isHidden() and service.generator is not None  # stopping unloads nothing
        await win.shutdown()

    run(loop, body(), 280)


def test_dashboard_follows_each_model_of_a_server_holding_several(qtbot, loop, store, tiny_model, second_model):
    """Connected to a server with two models (here the app's own, 16 and 8 pages), the dashboard's picker
    lists both from the server's model_name labels and shows one model's numbers at a time, never their sum;
    disconnecting gives the picker back to the app's own models."""
    side = str(second_model)

    async def body():
        win = make_window(qtbot, store, await loaded_service(tiny_model))
        service, dash = win.service, win.dashboard
        assert await service.load_beside(side, cache_tokens=2048)
        assert await win.local_server.start("127.0.0.1", 0, None)
        assert await win.remote.connect(win.local_server.url + "/v1")
        await wait_until(lambda: dash.model_choice.count() == 2 and not dash.model_choice.isHidden(),
                         what="the picker to list the server's models")
        names = [dash.model_choice.itemData(i) for i in range(2)]
        assert names == [r["name"] for r in win.local_server.models()]
        await wait_until(lambda: dash.snapshot is not None and dash.snapshot["pages_total"] == 16,
                         what="the first model's numbers")
        assert len(dash.snapshot["page_states"]) == 16  # with its page map
        dash.model_choice.setCurrentIndex(1)
        dash.model_choice.activated.emit(1)
        await wait_until(lambda: dash.snapshot is not None and dash.snapshot["pages_total"] == 8,
                         what="the second model's numbers")
        assert win.remote.poller.model == names[1] and service.metrics_model is None
        await win.remote.disconnect()
        assert [dash.model_choice.itemData(i) for i in range(2)] == [None, side]  # the app's models again
        await win.local_server.stop()
        await win.shutdown()

    run(loop, body(), 200)
