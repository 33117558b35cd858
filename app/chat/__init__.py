"""Chat views and their model: ChatSession (one chat's conversation and running reply), the chat pane,
its transcript and code blocks, the pane's small widgets and the chat list."""
