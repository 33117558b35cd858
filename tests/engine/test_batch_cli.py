"""`python -m engine batch` on a tiny random model, as real subprocesses: every row done, greedy outputs equal
each row's solo run, a run killed mid-way (SIGKILL) resumes with every input done exactly once, and a
template naming a missing column is refused with its name."""
from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from engine import DynamicGenerator, DynamicJob, Model, PagedCache, SamplerSettings, Tokenizer
from engine.batch.cli_run import progress_path

pytestmark = pytest.mark.timeout(300)
ROOT = Path(__file__).resolve().parents[2]
SYSTEM = "Answer in one line."


def batch_cmd(model, inputs, output, *extra) -> list[str]:
    return [sys.executable, "-m", "engine", "batch", "--model", str(model), "--input", str(inputs),
            "--template", "Summarise: {text} ({lang})", "--system", SYSTEM, "--output", str(output),
            "--greedy", *extra]


def env() -> dict:
    return {**os.environ, "PYTHONPATH": str(ROOT)}


def write_inputs(path: Path, n: int) -> list[dict]:
    rows = [{"id": str(i), "text": f"Item number {i} is a {'red' if i % 2 else 'blue'} box.", "lang": "en"}
            for i in range(n)]
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["id", "text", "lang"])
        w.writeheader()
        w.writerows(rows)
    return rows


def solo(folder, row: dict, n: int) -> str:
    model, tok = Model.load(folder), Tokenizer.load(folder)
    gen = DynamicGenerator(model, PagedCache(model, max_tokens=1024, page_size=256), tok)
    text = tok.apply_chat_template([{"role": "system", "content": SYSTEM},
                                    {"role": "user", "content": f"Summarise: {row['text']} ({row['lang']})"}])
    return gen.generate(text, max_new_tokens=n, gen_settings=SamplerSettings.greedy(), encode_special_tokens=True,
                        stop_conditions=sorted(tok.stop_token_ids), completion_only=True)


def test_all_rows_done_in_order_and_equal_their_solo_runs(tiny_llama_folder, tmp_path):
    rows = write_inputs(tmp_path / "in.csv", 5)
    out = tmp_path / "out.jsonl"
    p = subprocess.run(batch_cmd(tiny_llama_folder, tmp_path / "in.csv", out, "--max-new-tokens", "8"),
                       capture_output=True, text=True, env=env(), timeout=240)
    assert p.returncode == 0, p.stderr
    assert "5 rows, 0 already done, 5 to run" in p.stderr and "wrote 5 rows" in p.stderr
    got = [json.loads(line) for line in out.read_text().splitlines()]
    assert [g["id"] for g in got] == [r["id"] for r in rows]  # input order, input columns kept
    assert [g["output"] for g in got] == [solo(tiny_llama_folder, r, 8) for r in rows]
    assert all(g["error"] is None and g["new_tokens"] >= 1 for g in got)
    again = subprocess.run(batch_cmd(tiny_llama_folder, tmp_path / "in.csv", tmp_path / "out.csv",
                                     "--max-new-tokens", "8", "--quiet"), capture_output=True, text=True, env=env(),
                           timeout=240)
    assert again.returncode == 0, again.stderr
    with open(tmp_path / "out.csv", newline="") as f:
        exported = list(csv.DictReader(f))
    assert [e["output"] for e in exported] == [g["output"] for g in got]


def test_killed_run_resumes_with_every_input_done_exactly_once(tiny_llama_folder, tmp_path):
    rows = write_inputs(tmp_path / "in.csv", 16)
    out = tmp_path / "out.jsonl"
    cmd = batch_cmd(tiny_llama_folder, tmp_path / "in.csv", out, "--max-new-tokens", "24", "--concurrency", "2")
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, env=env())
    try:
        for line in proc.stderr:  # bounded: the run ends (and stderr closes) after 16 rows at most
            if line.startswith("batch: 3/16 done"):
                proc.send_signal(signal.SIGKILL)
                break
    finally:
        proc.kill()
        proc.wait(60)
    assert proc.returncode == -signal.SIGKILL
    assert not out.exists()  # the output is written only once every row is done
    before = progress_path(out).read_text().splitlines()
    assert 1 + 3 <= len(before) < 1 + 16  # header, then the rows finished before the kill
    p = subprocess.run(cmd, capture_output=True, text=True, env=env(), timeout=240)
    assert p.returncode == 0, p.stderr
    done_before = len(before) - 1
    assert f"16 rows, {done_before} already done, {16 - done_before} to run" in p.stderr
    lines = [json.loads(x) for x in progress_path(out).read_text().splitlines()[1:]]
    assert sorted(x["index"] for x in lines) == list(range(16))  # every input once: none twice, none lost
    got = [json.loads(line) for line in out.read_text().splitlines()]
    assert [g["id"] for g in got] == [r["id"] for r in rows]
    assert all(g["error"] is None for g in got)


def test_template_with_a_missing_column_is_refused_naming_it(tiny_llama_folder, tmp_path):
    write_inputs(tmp_path / "in.csv", 2)
    cmd = batch_cmd(tiny_llama_folder, tmp_path / "in.csv", tmp_path / "out.jsonl")
    cmd[cmd.index("--template") + 1] = "Translate {text} into {language}"
    p = subprocess.run(cmd, capture_output=True, text=True, env=env(), timeout=120)
    assert p.returncode == 1
    assert p.stderr.strip().splitlines()[-1] == ("error: the template names column(s) {language} that the inputs "
                                                 "lack (their columns: id, text, lang)")
    assert not progress_path(tmp_path / "out.jsonl").exists()
