"""Export a batch run: every input column, then the reply and how it ended, one row per input, in input
order; CSV (spreadsheets) or JSONL (scripts), by the file's suffix."""
from __future__ import annotations

import csv
import json
from pathlib import Path

RESULT_COLUMNS = ("output", "eos_reason", "new_tokens", "error")


def export_results(path: str | Path, columns: list[str], records: list[tuple[dict, dict]]) -> int:
    """Write (input values, result dict) pairs (results as RowResult.as_dict gives them); returns the
    number of rows written. Input columns that clash with a result column are kept as `input.<name>`."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in (".csv", ".jsonl"):
        raise ValueError(f"{path.name}: export to a .csv or .jsonl file, not {suffix or 'no suffix'}")
    names = [f"input.{c}" if c in RESULT_COLUMNS else c for c in columns]
    rows = [{**{n: values.get(c, "") for n, c in zip(names, columns)},
             **{k: result.get(k) for k in RESULT_COLUMNS}} for values, result in records]
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8", newline="") as f:
        if suffix == ".csv":
            writer = csv.DictWriter(f, fieldnames=[*names, *RESULT_COLUMNS])
            writer.writeheader()
            writer.writerows({k: ("" if v is None else v) for k, v in r.items()} for r in rows)
        else:
            for r in rows:
                f.write(json.dumps(r, ensure_ascii=False) + "\n")
    tmp.replace(path)  # a reader never sees half an export
    return len(rows)
