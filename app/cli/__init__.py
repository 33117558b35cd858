"""`pagedeck COMMAND`: the terminal side of the app, as Ollama's and LM Studio's `lms` users expect it.

ls lists the models the Model tab finds, get downloads into the cache the Discover tab uses, run chats with
a model in this process through the engine's public API, rm deletes a download, ps asks a running server
what it holds; serve, bench and batch hand over to `python -m engine`. The bare `pagedeck` opens the window
(app.__main__). One module per command; app.cli.main parses and dispatches.
"""
