"""Remote mode: chatting through an OpenAI-compatible server, and the widgets that control it."""
