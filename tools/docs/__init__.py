"""Docs pages written from the code: `python -m tools.docs.NAME`. style_guide (the design tokens, colours with
their contrast, icons and look screenshots as docs/app/style-guide.md) is the one command."""
