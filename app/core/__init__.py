"""The app's Qt-free core: chat history and settings (store), presets, the session state's values,
context fitting, formatting, the Backend protocol, the remote server's client, backend and /metrics
parsing, export, chat colours, background tasks (spawn) and the Qt system-library check.

Nothing here imports Qt, qasync, pyqtgraph, torch or the kernels (an import-linter contract), so it can
be read, tested and reused without a display or a model.
"""
