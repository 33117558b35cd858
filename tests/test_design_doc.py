"""ARCHITECTURE.md names every module of the library and its tools, and names only modules that exist.

The design document is the map a new reader starts from, so a module it leaves out is one nobody finds and
a module it names that is gone sends the reader looking for nothing. A module counts as named when a path
or name in the document leads to its file: a path from the repository root (`engine/model/loader.py`), a
path or file name relative to the section it appears in (a section's heading names its folder:
`### engine/model/: ...` makes `loader.py` mean `engine/model/loader.py`; a table row's first cell can name
a sub-folder, as the app's table does), a dotted module name (`engine.vision.image_input`,
`tools.bench.bench_big`), or, in backticks, a bare module name (`kernel_bench` in the tools list). A wildcard
(`triton_*.py`) names no module by itself, but must match something.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "ARCHITECTURE.md"
PACKAGES = ("app", "engine", "kernels", "tools")
SOURCE_SUFFIXES = (".py", ".cpp", ".h")

_PATH = re.compile(r"(?<![\w.*/-])((?:[\w*.-]+/)*[\w*-]+(?:\.py|\.cpp|\.h)|(?:[\w-]+/)+)(?![\w-])")
_DOTTED = re.compile(r"(?<![\w./-])((?:app|engine|kernels|tools)(?:\.\w+)+)")
_CODE = re.compile(r"`([^`]+)`")
_IDENT = re.compile(r"[A-Za-z_]\w*")


def _defines_something(init: Path) -> bool:
    """An `__init__.py` that only holds a docstring and imports is its package's label, not a module."""
    tree = ast.parse(init.read_text())
    return any(isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) for node in tree.body)


def source_modules(root: Path = ROOT) -> set[str]:
    """Every module of app/, engine/, kernels/ and tools/ (Python, and the C++ sources and headers)."""
    found = set()
    for package in PACKAGES:
        for path in (root / package).rglob("*"):
            if "__pycache__" in path.parts or path.suffix not in SOURCE_SUFFIXES or not path.is_file():
                continue
            if path.name == "__init__.py" and not _defines_something(path):
                continue
            found.add(path.relative_to(root).as_posix())
    return found


def _folders(tokens: list[str], within: list[Path], root: Path) -> list[Path]:
    """The folders some of these tokens name (a file names its own folder), resolved as paths are."""
    out = []
    for token in tokens:
        for candidate in _candidates(token.rstrip("/") or ".", within, root):
            if candidate.is_dir():
                out.append(candidate)
            elif candidate.is_file():
                out.append(candidate.parent)
    return out


def _candidates(token: str, bases: list[Path], root: Path) -> list[Path]:
    """Where a relative path may point: the root, each base folder, their parents within the tree, and
    their sub-folders one level down (prose in `### kernels/` says `qgemm.h` for kernels/cpu/qgemm.h)."""
    places = [root]
    for base in bases:
        places.append(base)
        places.extend(p for p in base.parents if root in p.parents)
        places.extend(p for p in base.iterdir() if p.is_dir() and p.name != "__pycache__")
    seen, out = set(), []
    for place in places:
        candidate = place / token
        if candidate not in seen:
            seen.add(candidate)
            out.append(candidate)
    return out


def _dotted(name: str, root: Path) -> list[Path]:
    """`engine.contract.paths.resources_folder` -> engine/contract/paths.py (the longest prefix that is one)."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        stem = root.joinpath(*parts[:end])
        for candidate in (stem.with_suffix(".py"), stem / "__init__.py"):
            if candidate.is_file():
                return [candidate]
    return []


def read_doc(text: str, root: Path = ROOT) -> tuple[set[str], list[str]]:
    """(modules the document names, the paths it names that lead to nothing, with their line numbers)."""
    named: set[str] = set()
    broken: list[str] = []
    bases: list[Path] = []
    for number, line in enumerate(text.splitlines(), 1):
        if re.match(r"#{1,6} ", line):
            bases = _folders(_PATH.findall(line), [], root)
            row_bases: list[Path] = []
        elif line.startswith("|"):
            first_cell = line.strip("|").split("|")[0]
            row_bases = _folders([t for t in _PATH.findall(first_cell) if t.endswith("/")], bases, root)
        else:
            row_bases = []
        within = bases + row_bases
        in_code = {t for code in _CODE.findall(line) for t in _PATH.findall(code)}
        for token in _PATH.findall(line):
            if token.endswith("/") or (token.endswith((".cpp", ".h")) and "/" not in token and token not in in_code):
                continue  # "llama.cpp" in prose is a project; a C++ file is named in backticks or by its path
            hits = [c for c in _candidates(token, within, root) for c in
                    (sorted(c.parent.glob(c.name)) if "*" in token else [c]) if c.is_file()]
            if not hits:
                broken.append(f"line {number}: {token}")
            elif "*" not in token:
                named.update(h.relative_to(root).as_posix() for h in hits)
        for name in _DOTTED.findall(line):
            named.update(p.relative_to(root).as_posix() for p in _dotted(name, root))
        for code in _CODE.findall(line):
            if _IDENT.fullmatch(code):
                for candidate in _candidates(code + ".py", within, root):
                    if candidate.is_file():
                        named.add(candidate.relative_to(root).as_posix())
    return named, broken


def test_every_module_is_in_the_design_doc():
    named, _ = read_doc(DOC.read_text())
    missing = sorted(source_modules() - named)
    assert missing == [], "ARCHITECTURE.md has no row or mention for: " + ", ".join(missing)


def test_every_path_the_design_doc_names_exists():
    _, broken = read_doc(DOC.read_text())
    assert broken == [], "ARCHITECTURE.md names files that do not exist: " + "; ".join(broken)


def test_a_module_left_out_or_a_path_gone_is_caught(tmp_path):
    """The reader itself: a row for a module makes it named; a module without one, or a row whose file is
    gone, is reported."""
    for name in ("pkg/sub/kept.py", "pkg/sub/left_out.py", "engine/x.cpp"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("")
    text = ("### pkg/sub/: things\n\n| module | concept |\n| --- | --- |\n| `kept.py` | kept |\n"
            "| `gone.py` | a module since removed |\n\n## Elsewhere\n\n`engine/x.cpp` and `pkg/sub/*.py` in prose.\n")
    named, broken = read_doc(text, tmp_path)
    assert named == {"pkg/sub/kept.py", "engine/x.cpp"}
    assert broken == ["line 6: gone.py"]
