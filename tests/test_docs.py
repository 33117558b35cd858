"""The documentation keeps up with the code: every public name of `engine` has its entry in the API
reference, and every file the README links to exists. (`make test` also builds the site with
`mkdocs build --strict`, which fails on a broken link inside docs/ or an API entry that names nothing.)"""
from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
API_PAGE = ROOT / "docs" / "engine" / "api.md"


def engine_exports() -> set[str]:
    """`engine.__all__`, read from engine/__init__.py's export table without importing the engine."""
    tree = ast.parse((ROOT / "engine" / "__init__.py").read_text())
    for node in tree.body:
        target = node.targets[0] if isinstance(node, ast.Assign) else getattr(node, "target", None)
        if isinstance(target, ast.Name) and target.id == "_EXPORTS":
            return set(ast.literal_eval(node.value))
    raise AssertionError("engine/__init__.py has no _EXPORTS table")


def documented_names(text: str) -> set[str]:
    return set(re.findall(r"^::: engine\.(\w+)\s*$", text, re.M))


def test_every_public_engine_name_is_in_the_api_reference():
    missing = engine_exports() - documented_names(API_PAGE.read_text())
    assert not missing, f"docs/engine/api.md lacks `::: engine.NAME` for: {sorted(missing)}"


def test_the_api_reference_names_only_public_names():
    extra = documented_names(API_PAGE.read_text()) - engine_exports()
    assert not extra, f"docs/engine/api.md documents names engine does not export: {sorted(extra)}"


def test_a_name_left_out_of_the_reference_is_caught():
    text = API_PAGE.read_text().replace("::: engine.PagedCache\n", "")
    assert "PagedCache" in engine_exports() - documented_names(text)


def readme_links(text: str) -> list[str]:
    """Relative targets of the README's Markdown links and images (anchors dropped)."""
    targets = re.findall(r"\]\(([^)\s]+)\)", text)
    return [t.split("#")[0] for t in targets if not re.match(r"[a-z]+:", t) and not t.startswith("#")]


def test_every_file_the_readme_links_to_exists():
    links = readme_links((ROOT / "README.md").read_text())
    assert links, "the README links to nothing"
    assert [t for t in links if not (ROOT / t).exists()] == []


def _doc_texts() -> dict[str, str]:
    paths = [ROOT / "README.md", ROOT / "ARCHITECTURE.md", *sorted((ROOT / "docs").rglob("*.md"))]
    return {p.relative_to(ROOT).as_posix(): p.read_text() for p in paths}


def _cli_words() -> set[str]:
    tree = ast.parse((ROOT / "engine" / "cli.py").read_text())
    return {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)}


def test_every_command_the_docs_show_exists():
    """`python -m tools.PACKAGE.NAME` (or `tests.oracles.NAME`) is a module of the checkout, `python -m engine CMD`
    a command of engine/cli.py."""
    words, wrong = _cli_words(), []
    for name, text in _doc_texts().items():
        for module in re.findall(r"python -m ((?:tools|tests)(?:\.[a-z_0-9]+)+)", text):
            if not ROOT.joinpath(*module.split(".")).with_suffix(".py").is_file():
                wrong.append(f"{name}: {module}")
        for command in re.findall(r"python -m engine ([a-z][\w-]*)", text):
            if command not in words:
                wrong.append(f"{name}: engine {command}")
    assert wrong == []
