"""pagedeck's desktop app (PySide6 + qasync): chats that all stream at once through one batched generator.

app/ talks to the engine only through `engine`'s public API and never imports torch. Its packages, each
importing only those listed after it (an import-linter layers contract):

- window: the main window and its parts (chat tabs and tiles, model loading, status line, menus, the
  state kept across restarts), desktop integration and the Qt event loop.
- local, remote: the backends the chats talk to: the in-process generator (EngineService) and remote
  mode (chatting through an OpenAI-compatible server).
- chat: one chat's session (its conversation and running reply), its pane, transcript and the chat list.
- panels: the docked panels (dashboard, page map, model, LoRA, server) and the chat settings dialog.
- preferences: app-wide preferences, the theme and their dialog.
- core: the Qt-free model: store, settings, presets, state values, context fitting, formatting, the
  Backend protocol, the remote client and backend, export.
"""
