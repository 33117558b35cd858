"""engine.envs is the one owner of pagedeck's environment variables: no other source reads one from the
environment (Python's os.environ / os.getenv, C++'s getenv), every PAGEDECK_* name the tree mentions is in its
table, the table's readers are the modules that read each, a value is read once until refresh(), and the
docs page is the table's generated output."""
from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from engine import envs

ROOT = Path(__file__).resolve().parents[2]
SOURCE_DIRS = ("app", "engine", "kernels", "tools", "tests", "packaging")
NAME = re.compile(r"\bPAGEDECK_[A-Z0-9_]+\b")
ENVIRON = {"os.environ", "environ"}


def _files(*suffixes: str) -> list[Path]:
    return sorted(p for d in SOURCE_DIRS for p in (ROOT / d).rglob("*")
                  if p.suffix in suffixes and p.is_file() and "__pycache__" not in p.parts)


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return ""


def environment_reads(source: str) -> list[tuple[int, str]]:
    """(line, code) of each read of a pagedeck variable from the environment in Python source: os.environ[...]
    (loaded), os.environ.get / setdefault, os.getenv, `... in os.environ`, whose name is a PAGEDECK_ string or
    not a string constant at all (a name computed at run time could be one)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and (
                _dotted(node.func) in ("os.getenv", "getenv") or (
                isinstance(node.func, ast.Attribute) and node.func.attr in ("get", "setdefault")
                and _dotted(node.func.value) in ENVIRON)):
            key = node.args[0] if node.args else None
        elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load) and _dotted(node.value) in ENVIRON:
            key = node.slice
        elif isinstance(node, ast.Compare) and any(_dotted(c) in ENVIRON for c in node.comparators):
            key = node.left
        else:
            continue
        if not (isinstance(key, ast.Constant) and isinstance(key.value, str)) or key.value.startswith(envs.PREFIX):
            found.append((node.lineno, ast.unparse(node)))
    return found


CPP_READ = re.compile(r"\b(?:secure_)?getenv\s*\(")


def test_only_engine_envs_reads_the_environment():
    owner = ROOT / "engine" / "envs.py"
    stray = [f"{p.relative_to(ROOT)}:{line}: {code}" for p in _files(".py") if p != owner
             for line, code in environment_reads(p.read_text())]
    stray += [f"{p.relative_to(ROOT)}:{text.count(chr(10), 0, m.start()) + 1}: getenv (the value must come in "
              "from kernels/cpu_ext.py)" for p in _files(".cpp", ".h", ".c", ".hpp")
              for text in [p.read_text()] for m in CPP_READ.finditer(text)]
    assert not stray, "read pagedeck's environment through engine.envs only:\n" + "\n".join(stray)


def test_the_scan_sees_each_form_of_read():
    reads = environment_reads(
        "import os\nfrom os import environ, getenv\n"
        "a = os.environ['PAGEDECK_X']\nb = os.environ.get('PAGEDECK_X', '1')\nc = os.getenv('PAGEDECK_X')\n"
        "d = 'PAGEDECK_X' in os.environ\ne = environ.get(NAME)\nf = getenv('PAGEDECK_X')\n"
        "os.environ.setdefault('PAGEDECK_X', '1')\n"
        # not reads of a pagedeck variable: other programs' variables, writes, a child's environment
        "g = os.environ.get('HF_HOME')\nos.environ['PAGEDECK_X'] = '1'\nos.environ.pop('PAGEDECK_X')\n"
        "h = {**os.environ, 'PAGEDECK_X': '1'}\n")
    assert [line for line, _ in reads] == [3, 4, 5, 6, 7, 8, 9]
    assert CPP_READ.search('const char* v = std::getenv("PAGEDECK_ROW_CHUNK");')


def test_every_variable_named_in_the_tree_is_in_the_table():
    texts = _files(".py", ".cpp", ".h", ".sh", ".md", ".toml") + [
        ROOT / name for name in ("Makefile", "pyproject.toml", "README.md", "ARCHITECTURE.md", ".ci/run")
        if (ROOT / name).is_file()] + sorted((ROOT / "docs").rglob("*.md"))
    named = {m for p in texts if p != Path(__file__).resolve() for m in NAME.findall(p.read_text(errors="replace"))}
    assert named - set(envs.VARIABLES) == set(), "add these to engine/envs.py's table"
    assert set(envs.VARIABLES) <= named  # and each one in the table is used somewhere


def test_the_table_names_who_reads_each_variable():
    """A module reads a variable as `envs.NAME`: the modules that do are the table's readers, no more, no less."""
    readers: dict[str, set[str]] = {name: set() for name in envs.VARIABLES}
    for path in _files(".py"):
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        for name in re.findall(r"\benvs\.(PAGEDECK_[A-Z0-9_]+)\b", path.read_text()):
            if path.name not in ("envs.py", "test_envs.py"):
                readers.setdefault(name, set()).add(module)
    assert readers == {name: set(v.readers) for name, v in envs.VARIABLES.items()}


def test_engine_envs_loads_the_standard_library_only():
    """The app (no torch) and the kernels (no engine) import it: it must bring nothing else with it."""
    code = ("import sys; before = set(sys.modules); import engine.envs; "
            "print(sorted(m for m in set(sys.modules) - before if m.split('.')[0] not in sys.stdlib_module_names))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip() == "['engine', 'engine.envs']"


def test_a_value_is_read_once_until_refresh(monkeypatch):
    monkeypatch.setenv("PAGEDECK_DENSE_COPY", "off")  # the suite's monkeypatch refreshes the variable
    assert envs.PAGEDECK_DENSE_COPY == "off"
    os.environ["PAGEDECK_DENSE_COPY"] = "keep"  # behind envs' back: the kept value stands
    assert envs.PAGEDECK_DENSE_COPY == "off"
    envs.refresh("PAGEDECK_DENSE_COPY")
    assert envs.PAGEDECK_DENSE_COPY == "keep"
    monkeypatch.delenv("PAGEDECK_DENSE_COPY")
    assert envs.PAGEDECK_DENSE_COPY == "auto"
    with pytest.raises(KeyError):
        envs.refresh("PAGEDECK_NO_SUCH_VARIABLE")
    with pytest.raises(AttributeError):
        envs.PAGEDECK_NO_SUCH_VARIABLE  # noqa: B018


@pytest.mark.parametrize("name,raw,value", [
    ("PAGEDECK_DENSE_COPY", " No ", "off"), ("PAGEDECK_DENSE_COPY", "TRUE", "keep"),
    ("PAGEDECK_DENSE_COPY", "x", "auto"),
    ("PAGEDECK_HUGE_PAGES", "0", False), ("PAGEDECK_HUGE_PAGES", "1", True), ("PAGEDECK_HUGE_PAGES", "", True),
    ("PAGEDECK_CPU_KERNELS", "0", False), ("PAGEDECK_CPU_ISA", "avx2", "avx2"), ("PAGEDECK_CPU_ISA", "avx512", "avx512"),
    ("PAGEDECK_CPU_ISA", "sse", "native"), ("PAGEDECK_CPU_ISA", "", "native"),
    ("PAGEDECK_ROW_GROUPS", "0", False), ("PAGEDECK_QGEMM_ROWS", "12", 12), ("PAGEDECK_QGEMM_ROWS", "", None),
    ("PAGEDECK_ROW_CHUNK", "0", 0), ("PAGEDECK_SETTINGS", "/x/p.ini", Path("/x/p.ini")),
    ("PAGEDECK_SETTINGS", "", None), ("PAGEDECK_API_KEY", "", None), ("PAGEDECK_API_KEY", "k", "k"),
    ("PAGEDECK_TRITON_NATIVE", "1", True), ("PAGEDECK_TRITON_NATIVE", "0", False),
    ("PAGEDECK_SOAK_RELOAD_EVERY", "", 150), ("PAGEDECK_SOAK_SWITCH_INTERVAL", "0.005", 0.005),
])
def test_values_parse_as_the_table_says(monkeypatch, name, raw, value):
    monkeypatch.setenv(name, raw)
    assert getattr(envs, name) == value


def test_a_malformed_number_names_its_variable(monkeypatch):
    monkeypatch.setenv("PAGEDECK_ROW_CHUNK", "lots")
    with pytest.raises(ValueError, match="PAGEDECK_ROW_CHUNK.*'lots'"):
        envs.PAGEDECK_ROW_CHUNK  # noqa: B018


def test_the_docs_page_is_the_generated_table():
    """docs/reference/environment.md is `python -m engine.envs --markdown`'s output: regenerate it after a change
    to the table (`python -m engine.envs --markdown > docs/reference/environment.md`)."""
    out = subprocess.run([sys.executable, "-m", "engine.envs", "--markdown"], capture_output=True, text=True,
                         cwd=ROOT, check=True).stdout
    assert out == envs.markdown()
    assert (ROOT / "docs" / "reference" / "environment.md").read_text() == out
    assert all(f"| `{name}` |" in out for name in envs.VARIABLES)
