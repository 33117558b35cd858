"""pagedeck's desktop app (PySide6 + qasync): chats that all stream at once through one batched generator.

app/ talks to the engine only through `engine`'s public API and never imports torch.
"""
