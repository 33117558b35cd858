"""mkdocs hook: files the site serves that live elsewhere in the repository, so that nothing is copied by hand.

- `resources/screenshots/*.png` are served as `screenshots/NAME.png` (pages write `../screenshots/NAME.png`):
  the screenshots stay where the screenshot tools write them and the README shows them from, and a page
  that names one that is not there fails `mkdocs build --strict`.
- `server/openapi.json` is the server's own OpenAPI description (`engine.server.openapi.openapi_spec()`, what
  `GET /openapi.json` answers), and the marker `<!-- openapi-operations -->` in a page becomes the table of
  its operations, so the documented routes are the served ones.
"""
from __future__ import annotations

import json
from pathlib import Path

from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parents[2]
SCREENSHOTS = ROOT / "resources" / "screenshots"
OPERATIONS_MARKER = "<!-- openapi-operations -->"
_spec_cache: dict = {}


def _spec() -> dict:
    if not _spec_cache:
        from engine.server.openapi import openapi_spec  # loads torch: once per build

        _spec_cache.update(openapi_spec())
    return _spec_cache


def on_files(files, config):
    for png in sorted(SCREENSHOTS.glob("*.png")):
        files.append(File.generated(config, f"screenshots/{png.name}", abs_src_path=str(png)))
    files.append(File.generated(config, "server/openapi.json", content=json.dumps(_spec(), indent=2) + "\n"))
    return files


def operations_table(spec: dict) -> str:
    rows = ["| method | path | what it does | answers |", "| --- | --- | --- | --- |"]
    for path, item in spec["paths"].items():
        for method, op in item.items():
            if method not in ("get", "post", "put", "delete", "patch"):
                continue
            codes = ", ".join(sorted(op.get("responses", {})))
            summary = " ".join(op.get("summary", "").split()).replace("|", "\\|")
            rows.append(f"| `{method.upper()}` | `{path}` | {summary} | {codes} |")
    return "\n".join(rows)


def on_page_markdown(markdown, page, config, files):
    if OPERATIONS_MARKER in markdown:
        markdown = markdown.replace(OPERATIONS_MARKER, operations_table(_spec()))
    return markdown
