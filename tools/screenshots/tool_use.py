"""Screenshots of tool use and thinking: `python -m tools.screenshots.tool_use OUTDIR [--size WxH]`.

Opens the real main window (real default model, real MCP server: tests/data/mcp_servers/calc.py over
stdio, configured through a scratch mcp.json) under a display (e.g. `xvfb-run -s "-screen 0 1600x900x24"`)
and saves:

- app-mcp-approval.png: the screen while the approval dialog asks before the model's `add` call runs;
- app-mcp-tool-call.png: the chat after the call: its block (tool, server, arguments, result), then the answer;
- app-thinking.png: a reply with its thinking folded into one line (its token count and time) above the answer.

The default model (SmolLM2-135M) was not trained to call tools or to think, so their text is forced with
constrained decoding (an exact text the engine generates token by token): the call and the answer after
its result, and the thinking; the answer after the thinking is the model's own. The call, the approval,
the MCP server, the parsing and the transcript are the real ones.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Sequence

from tools.screenshots._session import qt_session

CALC = Path(__file__).resolve().parents[2] / "tests" / "data" / "mcp_servers" / "calc.py"
CALL = '<tool_call>\n{"name": "add", "arguments": {"a": 1234, "b": 4321}}\n</tool_call>'
ANSWER = "1234 + 4321 = 5555, as the add tool says."
THOUGHT = ("<think>The user asks for the boiling point of water at sea level. That is 100 degrees Celsius, "
           "or 212 degrees Fahrenheit. I should give both and keep it short.</think>")


def _forced(script: list[str | None]):
    """A service _filters replacement: each job's first text forced from `script` (None: free)."""
    def filters(_settings):
        import engine

        text = script.pop(0) if script else None
        if text is None:
            return None
        if text.startswith("<think>"):  # the thinking is forced; the answer after it is the model's
            return [engine.RegexFilter(_escape(text) + r"[^<]{1,300}")]
        return [engine.ChoiceFilter([text])]
    return filters


def _escape(text: str) -> str:
    return "".join("\\" + c if c in r"\.^$|?*+()[]{}/\"" else c for c in text)


async def _wait(predicate, seconds: float, what: str) -> None:
    for _ in range(int(seconds * 10)):
        if predicate():
            return
        await asyncio.sleep(0.1)
    raise SystemExit(f"timed out waiting for {what}")


async def _shots(outdir: Path, data_dir: Path, size: tuple[int, int]) -> list[Path]:
    from PySide6.QtGui import QGuiApplication

    from app.window.main_window import MainWindow

    (data_dir / "mcp.json").write_text(json.dumps({"mcpServers": {"calc": {"command": sys.executable,
                                                                           "args": [str(CALC)]}}}))
    window = MainWindow(data_dir=data_dir)
    window.show()
    window.move(0, 0)  # (no window manager under Xvfb: the screen grab of the dialog needs it at the origin)
    window.resize(*size)
    saved = []

    def grab(name: str, widget=None) -> None:
        path = outdir / name
        image = widget.grab() if widget is not None else QGuiApplication.primaryScreen().grabWindow(0)
        if not image.save(str(path)):
            raise OSError(f"could not write screenshot {path}")
        saved.append(path)

    try:
        if not await window.loader.ready():
            raise SystemExit(f"model did not load: {window.status.last_error}")
        window.service._filters = _forced([CALL, ANSWER, THOUGHT])
        tools_pane = window.new_chat("Sums with an MCP tool")
        s = tools_pane.session
        s.set_settings(replace(s.settings, tools=("calc/add", "calc/lookup"), max_new_tokens=80, temperature=0.2, seed=3))
        tools_pane.send("What is 1234 + 4321? Use the add tool.")
        await _wait(lambda: tools_pane.approvals, 120, "the approval dialog")
        await asyncio.sleep(0.5)  # let the loop paint the dialog
        grab("app-mcp-approval.png")
        tools_pane.approvals[0].allow_button.click()
        await _wait(lambda: s.task.done(), 240, "the answer")
        await asyncio.sleep(0.2)
        grab("app-mcp-tool-call.png", window)
        think_pane = window.new_chat("A reply that thought first")
        t = think_pane.session
        t.set_settings(replace(t.settings, max_new_tokens=120, temperature=0.2, seed=5))
        think_pane.send("At what temperature does water boil at sea level?")
        await _wait(lambda: t.task.done(), 240, "the thinking reply")
        await asyncio.sleep(0.2)
        grab("app-thinking.png", window)
    finally:
        await window.shutdown()
        window.close()
    return saved


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Save screenshots of MCP tool use and thinking.")
    parser.add_argument("outdir", type=Path)
    parser.add_argument("--size", default="1600x900", help="window size WxH")
    args = parser.parse_args(argv)
    size = tuple(int(v) for v in args.size.lower().split("x"))
    args.outdir.mkdir(parents=True, exist_ok=True)
    with qt_session("pagedeck-shots-") as (loop, data_dir):  # mcp.json sits beside the scratch preferences
        for path in loop.run_until_complete(_shots(args.outdir, data_dir, size)):
            print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
