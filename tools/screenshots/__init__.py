"""Screenshots of the real main window for the README and the docs: `python -m tools.screenshots.NAME OUTDIR`.
readme (the README's main, dashboard, LoRA and batch shots), compare (compare mode), look (a new chat, a message's
actions), tool_use (tool calls, approval and thinking) and expert_map (the dashboard's expert map on a MoE model) are commands; _images (two chats sharing a picture's pages, run by readme) and _session
(the Qt loop on a scratch folder, grabs and mid-stream waits every command shares) are their helpers.
"""
