"""Batch inputs without a model: CSV and JSONL rows, the {column} template, row keys, bad files."""
import json

import pytest

from engine.batch.export import export_results
from engine.batch.inputs import BatchRow, PromptTemplate, read_inputs


def test_csv_and_jsonl_rows_and_stable_keys(tmp_path):
    (tmp_path / "a.csv").write_text('text,n\n"Hello, world",1\nBye,2\n')
    (tmp_path / "a.jsonl").write_text(json.dumps({"text": "Hello, world", "n": 1}) + "\n\n"
                                      + json.dumps({"text": "Bye", "n": 2, "extra": None}) + "\n")
    cols, rows = read_inputs(tmp_path / "a.csv")
    jcols, jrows = read_inputs(tmp_path / "a.jsonl")
    assert cols == ["text", "n"] and jcols == ["text", "n", "extra"]
    assert [r.values for r in rows] == [{"text": "Hello, world", "n": "1"}, {"text": "Bye", "n": "2"}]
    assert jrows[1].values == {"text": "Bye", "n": "2", "extra": ""}
    assert rows[0].key == read_inputs(tmp_path / "a.csv")[1][0].key  # same row, same key, every run
    assert rows[0].key != BatchRow(0, {"text": "Hello, world!", "n": "1"}).key  # an edited row is another row
    assert rows[0].key != BatchRow(1, rows[0].values).key


@pytest.mark.parametrize("name,content,message", [
    ("x.txt", "a", "batch inputs are .csv or .jsonl"),
    ("e.csv", "", "no header row"),
    ("h.csv", "text\n", "holds no input rows"),
    ("w.csv", "text\na,b\n", "line 2: more fields"),
    ("j.jsonl", '{"a": 1}\nnot json\n', "j.jsonl line 2 is not JSON"),
    ("l.jsonl", '[1, 2]\n', "line 1 is not a JSON object"),
])
def test_bad_input_files_are_named(tmp_path, name, content, message):
    (tmp_path / name).write_text(content)
    with pytest.raises(ValueError, match=message):
        read_inputs(tmp_path / name)


def test_template_fields_missing_columns_and_literal_braces():
    t = PromptTemplate("Summarise {text} in {{JSON}} for {who}; {text}")
    assert t.fields == ["text", "who"]
    assert t.render(BatchRow(0, {"text": "A", "who": "me"})) == "Summarise A in {JSON} for me; A"
    with pytest.raises(ValueError, match=r"column\(s\) \{who\} that the inputs lack \(their columns: text, n\)"):
        t.check_columns(["text", "n"])
    for bad, message in (("{text:>10}", "must be a column name"), ("{text!r}", "must be a column name"),
                         ("{}", "must be a column name"), ("no fields", "names no"), ("open {", "malformed"),
                         ("", "empty")):
        with pytest.raises(ValueError, match=message):
            PromptTemplate(bad)


def test_export_csv_and_jsonl_in_order_with_clashing_columns(tmp_path):
    records = [({"output": "in0", "x": "a"}, {"output": "out0", "eos_reason": "stop_token", "new_tokens": 3,
                                             "error": None})]
    assert export_results(tmp_path / "r.jsonl", ["output", "x"], records) == 1
    line = json.loads((tmp_path / "r.jsonl").read_text())
    assert line == {"input.output": "in0", "x": "a", "output": "out0", "eos_reason": "stop_token", "new_tokens": 3,
                    "error": None}
    export_results(tmp_path / "r.csv", ["output", "x"], records)
    assert (tmp_path / "r.csv").read_text().splitlines()[0] == "input.output,x,output,eos_reason,new_tokens,error"
    with pytest.raises(ValueError, match="export to a .csv or .jsonl"):
        export_results(tmp_path / "r.xlsx", [], [])
