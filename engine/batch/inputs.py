"""A batch run's inputs: the rows of a CSV or JSONL file, and the prompt template filled from each row.

A row is identified across restarts by its position and a hash of its values (`BatchRow.key`), so a
resumed run skips exactly the rows already done and a file edited meanwhile is noticed rather than
silently mixed with old results.
"""
from __future__ import annotations

import csv
import hashlib
import json
import string
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

INPUT_SUFFIXES = (".csv", ".jsonl")


@dataclass(frozen=True)
class BatchRow:
    index: int  # 0-based position in the file (data rows only)
    values: dict  # column -> text

    @property
    def key(self) -> str:
        """Position and content: the same row of the same file has the same key in every run."""
        raw = json.dumps([self.index, self.values], sort_keys=True, ensure_ascii=False).encode()
        return hashlib.blake2b(raw, digest_size=12).hexdigest()


def read_inputs(path: str | Path) -> tuple[list[str], list[BatchRow]]:
    """(columns, rows) of a .csv (header row first) or .jsonl (one JSON object a line) file.

    Values become text (JSON numbers and booleans as JSON writes them; null as ""). ValueError names the
    file and line of anything malformed; an empty file or one with no rows is refused too."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in INPUT_SUFFIXES:
        raise ValueError(f"{path.name}: batch inputs are .csv or .jsonl files, not {suffix or 'no suffix'}")
    if not path.is_file():
        raise ValueError(f"input file {path} does not exist")
    text = path.read_text(encoding="utf-8-sig")
    columns, records = _csv(text, path.name) if suffix == ".csv" else _jsonl(text, path.name)
    if not records:
        raise ValueError(f"{path.name} holds no input rows")
    return columns, [BatchRow(i, values) for i, values in enumerate(records)]


def _csv(text: str, name: str) -> tuple[list[str], list[dict]]:
    reader = csv.DictReader(text.splitlines())
    columns = list(reader.fieldnames or [])
    if not columns:
        raise ValueError(f"{name} has no header row (the first line names the columns)")
    records = []
    for row in reader:
        if None in row:
            raise ValueError(f"{name} line {reader.line_num}: more fields than the header's {len(columns)} columns")
        records.append({c: row[c] or "" for c in columns})
    return columns, records


def _jsonl(text: str, name: str) -> tuple[list[str], list[dict]]:
    columns: dict[str, None] = {}
    records = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{name} line {n} is not JSON: {exc.msg}") from None
        if not isinstance(obj, dict):
            raise ValueError(f"{name} line {n} is not a JSON object")
        records.append({k: _text(v) for k, v in obj.items()})
        columns.update(dict.fromkeys(obj))
    return list(columns), records


def _text(value) -> str:
    if value is None:
        return ""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


class PromptTemplate:
    """`Summarise: {text}`: each `{column}` is replaced by that column's value (`{{` and `}}` are literal
    braces); nothing else is interpreted (no format specs, no attribute or index lookups)."""

    def __init__(self, text: str):
        if not isinstance(text, str) or not text.strip():
            raise ValueError("the prompt template is empty")
        self.text = text
        self.parts: list[tuple[str, str | None]] = []
        try:
            parsed = list(string.Formatter().parse(text))
        except ValueError as exc:
            raise ValueError(f"the prompt template is malformed ({exc}); write a literal brace as {{{{ or }}}}") from None
        for literal, field, spec, conversion in parsed:
            if field is not None and (not field.strip() or spec or conversion):
                raise ValueError(f"template field {{{field}{'!' + conversion if conversion else ''}"
                                 f"{':' + spec if spec else ''}}} must be a column name in braces, like {{text}}")
            self.parts.append((literal, field))
        if not self.fields:
            raise ValueError("the prompt template names no {column}: every row would get the same prompt")

    @property
    def fields(self) -> list[str]:
        """The columns it names, in order of first use."""
        return list(dict.fromkeys(f for _, f in self.parts if f is not None))

    def check_columns(self, columns: Iterable[str]) -> None:
        """ValueError naming every column the template uses that the inputs lack."""
        have = list(columns)
        missing = [f for f in self.fields if f not in have]
        if missing:
            names = ", ".join(f"{{{m}}}" for m in missing)
            raise ValueError(f"the template names column(s) {names} that the inputs lack "
                             f"(their columns: {', '.join(have) or 'none'})")

    def render(self, row: BatchRow) -> str:
        return "".join(literal + (row.values.get(field, "") if field is not None else "") for literal, field in self.parts)


def batch_messages(system: str | None, user: str) -> list[dict]:
    """The chat a row becomes: the run's system prompt (shared by every row, so its pages are too) and the
    filled template as the user's message."""
    return ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": user}]
