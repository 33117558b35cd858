"""The window's docked panels and dialogs: dashboard and page map, model panel and browser, LoRA panel,
server panel, the chat settings dialog and its adapter picker. Each emits requests and shows state;
the window wires them to the engine service."""
