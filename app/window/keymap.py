"""Every window command's name, keys and description: the one place a shortcut is chosen.

The menus (app.window.menus) make their QActions from this table; the command palette
(app.window.command_palette) and Help > Keyboard shortcuts (app.window.shortcuts_help) list those same
QActions, so a key changed here changes in the menus, the palette and the help window together.
A command may have several keys: the first is the one menus show, the others are alternatives
(e.g. Ctrl+Tab beside Ctrl+PgDown).
"""
from __future__ import annotations

from dataclasses import dataclass

from PySide6.QtGui import QKeySequence


@dataclass(frozen=True)
class Command:
    text: str  # the menu text, with its & mnemonic
    keys: tuple[str | QKeySequence.StandardKey, ...] = ()
    about: str = ""  # what it does, for the palette, the help window and the action's status tip

    def sequences(self) -> list[QKeySequence]:
        out: list[QKeySequence] = []
        for key in self.keys:  # a standard key: the platform's main binding (not e.g. a keyboard's "New" key)
            out.extend(QKeySequence.keyBindings(key)[:1] if isinstance(key, QKeySequence.StandardKey)
                       else [QKeySequence(key)])
        return out


S = QKeySequence.StandardKey
COMMANDS: dict[str, Command] = {
    # File
    "new_chat": Command("&New chat", (S.New,), "Start a new chat and open it"),
    "export_md": Command("Export chat as &Markdown…", (), "Save the current chat as a Markdown file"),
    "export_json": Command("Export chat as &JSON…", (), "Save the current chat as a JSON file"),
    "preferences": Command("&Preferences…", (S.Preferences,), "Theme, font size and defaults for new chats"),
    "quit": Command("&Quit", (S.Quit,), "Close the window (replies are stopped and saved)"),
    # View
    "view_tabs": Command("&Tabs", (), "One chat at a time, as tabs"),
    "view_tiles_2": Command("Tiles: &2", (), "Two chats side by side (new chats open to fill them)"),
    "view_tiles_3": Command("Tiles: &3", (), "Three chats side by side (new chats open to fill them)"),
    "view_tiles_4": Command("Tiles: &4", (), "Four chats in a 2x2 grid (new chats open to fill them)"),
    "compare": Command("&Compare: one message to every tile", ("Ctrl+Shift+K",),
                       "Show the compare bar: type once, send to every ticked tile"),
    "next_pane": Command("Ne&xt chat pane", ("Ctrl+PgDown", "Ctrl+Tab"), "Move to the next tab or tile"),
    "previous_pane": Command("Pre&vious chat pane", ("Ctrl+PgUp", "Ctrl+Shift+Tab", "Ctrl+Backtab"),
                             "Move to the previous tab or tile"),
    "focus_composer": Command("&Focus message box", ("Ctrl+L",), "Put the cursor in the current chat's message box"),
    "palette": Command("Command &palette…", ("Ctrl+K", "Ctrl+Shift+P"), "Find any command by name and run it"),
    # Chat
    "chat_settings": Command("&Settings…", ("Ctrl+,",), "The current chat's sampler, system prompt and LoRA set"),
    "send_all": Command("Send to &all tiles", ("Ctrl+Shift+Return", "Ctrl+Shift+Enter"),
                        "Send the message being typed to every chat shown (the ticked ones in compare mode)"),
    "regenerate": Command("&Regenerate", ("Ctrl+R",), "Answer the current chat's last message again"),
    "continue": Command("C&ontinue the last reply", ("Ctrl+Shift+R",), "Let the last reply go on where it ended"),
    "stop": Command("S&top", ("Ctrl+.",), "Stop the current chat's reply (Esc in the message box too)"),
    "stop_all": Command("Stop a&ll", ("Ctrl+Alt+.",), "Stop every chat's reply"),
    "branch": Command("&Branch from the last message", ("Ctrl+B",),
                      "A new chat that shares this one's history up to its last message"),
    "copy_last": Command("&Copy last reply", ("Ctrl+Shift+C",), "Copy the current chat's last reply"),
    "pin_document": Command("&Pin a document…", (), "Pin a text or PDF file to the current chat"),
    "tools": Command("Tools and &thinking…", (), "The current chat's MCP tools and thinking switch"),
    "mcp_servers": Command("&MCP servers…", (), "Add, remove and check MCP servers"),
    "switch_model": Command("S&witch model…", ("Ctrl+M",), "Pick a recent model and load it"),
    # Help
    "shortcuts": Command("&Keyboard shortcuts", ("F1", "Ctrl+/"), "Every command and its keys"),
}
# The docks, in the View menu: Alt+1.. shows and raises each (and puts the keyboard focus in it).
DOCK_KEYS = ("Alt+1", "Alt+2", "Alt+3", "Alt+4", "Alt+5", "Alt+6", "Alt+7", "Alt+8", "Alt+9")


def plain(text: str) -> str:
    """A menu text without its & mnemonic and trailing "…": "S&witch model…" -> "Switch model"."""
    return text.replace("&&", "\0").replace("&", "").replace("\0", "&").rstrip("…").strip()
