"""The MCP servers dialog (mcp.json edited, validated, imported, servers checked against a real MCP server
process), a chat's Tools and thinking dialog, and the thinking switch reaching a template that has one."""
from __future__ import annotations

import json
import shutil

import pytest

from app.agent.mcp_config import load_config
from app.agent.tool_hub import ToolHub
from app.core.store import ChatSettings
from app.local.engine_service import EngineService
from app.panels.mcp_dialog import McpServersDialog
from tests.app.mcp_support import CALC, calc_stdio
from tests.app.support import loop, make_window, run, store, wait_until  # noqa: F401

pytestmark = pytest.mark.timeout(180)


def test_mcp_servers_dialog_validates_imports_checks_and_saves(qtbot, loop, tmp_path):
    hub = ToolHub(tmp_path / "mcp.json")
    hub.approvals.allow_always("calc/add")
    dlg = McpServersDialog(hub)
    qtbot.addWidget(dlg)
    dlg.editor.setPlainText('{"mcpServers": {"calc": {"args": []}}}')
    assert not dlg.save() and "'calc': give either a 'command'" in dlg.report.text()
    assert not (tmp_path / "mcp.json").exists()  # nothing saved, the text stays for fixing
    dlg.editor.setPlainText('{"mcpServers": {}}')
    lmstudio = tmp_path / "lmstudio-mcp.json"
    lmstudio.write_text(json.dumps({"mcpServers": {"calc": {"command": calc_stdio().command, "args": [str(CALC)]}}}))
    dlg.import_file(lmstudio)
    assert "Imported calc" in dlg.report.text() and str(CALC) in dlg.editor.toPlainText()

    async def check():
        dlg.check()
        await wait_until(lambda: "calc: 4 tools" in dlg.report.text(), 60, "the servers' tools")
        await hub.close()

    run(loop, check())
    assert "add" in dlg.report.text() and list(load_config(tmp_path / "mcp.json")) == ["calc"]
    assert "calc/add" in dlg.approvals.text()
    dlg.forget_btn.click()
    assert not hub.approvals.always_allowed("calc/add") and "none" in dlg.approvals.text()


def test_a_chats_tools_dialog_lists_the_servers_tools_and_sets_the_chat(qtbot, loop, store, tmp_path):  # noqa: F811
    async def body():
        hub = ToolHub(tmp_path / "mcp.json")
        await hub.set_servers({"calc": calc_stdio()})
        window = make_window(qtbot, store, EngineService())
        window.tools = window.chats.tools = hub
        pane = window.new_chat("tools")
        pane.session.set_settings(ChatSettings(tools=("gone/old",)))
        dlg = pane.open_tools()
        assert not dlg.thinking.isEnabled()  # no model loaded: no template with a thinking switch
        await wait_until(lambda: "4 tools from 1 servers" in dlg.status.text(), 60, "the tool list")
        texts = [dlg.tools.item(i).text() for i in range(dlg.tools.count())]
        assert any(t.startswith("calc/add — Add two integers.") for t in texts)
        assert "gone/old (not available now)" in texts  # kept, and still picked
        dlg.set_checked("calc/add")
        dlg.set_checked("gone/old", False)
        dlg.accept()
        assert pane.session.settings.tools == ("calc/add",)
        assert store.chat(pane.session.chat_id).settings.tools == ("calc/add",)  # stored with the chat
        await hub.close()

    run(loop, body())


QWEN3_LIKE = ("{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{%- endfor %}"
              "{%- if add_generation_prompt %}<|im_start|>assistant\n"
              "{%- if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{%- endif %}"
              "{%- endif %}")


def test_the_thinking_switch_reaches_a_template_that_has_one(tiny_llama_folder, tmp_path):
    import engine
    from app.agent.reply_rounds import thinks
    from app.local.chat_prompt import prompt_text

    folder = shutil.copytree(tiny_llama_folder, tmp_path / "qwen3ish")
    config = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": QWEN3_LIKE}))
    tok = engine.Tokenizer.load(folder)
    assert thinks(tok.chat_template)
    history = [{"role": "user", "content": "hi"}]
    off = prompt_text(tok, history, ChatSettings(thinking=False))
    on = prompt_text(tok, history, ChatSettings(thinking=True))
    assert off.endswith("<think>\n\n</think>") and "<think>" not in on  # Qwen3: an empty think block = off
