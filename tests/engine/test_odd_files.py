"""Odd GGUF files as users meet them: each broken one is refused with one line naming its problem (by
Model.load, by the model list, by `python -m engine generate`), and a split set (NAME-00001-of-0000N.gguf,
which llama.cpp loads from its first file) loads as one model, computing what the same model in one file
computes, and what llama.cpp computes on the same set."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from engine import Model, Tokenizer, load_model_and_tokenizer
from engine.model.catalog import discovery
from engine.model.catalog.info import read_model_info
from tools.logits import forward_tokens
from tools.models.synthetic_gguf import write_random_gguf

ROOT = Path(__file__).resolve().parents[2]
VOCAB = 49152


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("odd")
    good = write_random_gguf(d / "good.gguf", "tiny", 2, "Q8_0", seed=3)
    split = write_random_gguf(d / "split" / "tiny.gguf", "tiny", 2, "Q8_0", seed=3, split_max_tensors=8)
    data = good.read_bytes()
    (d / "truncated.gguf").write_bytes(data[: len(data) - 4096])
    (d / "header-cut.gguf").write_bytes(data[:3000])
    (d / "empty.gguf").write_bytes(b"")
    (d / "zip-renamed.gguf").write_bytes(b"PK\x03\x04" + bytes(200))
    write_random_gguf(d / "unknown-arch.gguf", "tiny", 1, "Q8_0", arch="mamba9")
    write_random_gguf(d / "vocab-mismatch.gguf", "tiny", 1, "Q8_0", vocab=VOCAB + 64)
    return {"dir": d, "good": good, "split": split}


ODD = {  # file -> what the one-line error must say
    "truncated.gguf": r"is truncated: tensor \S+ needs bytes up to \d+, file has \d+",
    "header-cut.gguf": r"not a valid GGUF file \(corrupt or truncated header",
    "empty.gguf": r"is empty \(0 bytes\): not a GGUF file",
    "zip-renamed.gguf": r"is not a GGUF file \(bad magic b'PK\\x03\\x04'\)",
    "unknown-arch.gguf": r"Unsupported model architecture 'mamba9'",
    "vocab-mismatch.gguf": r"vocabulary and embedding disagree: the vocabulary has 49,152 tokens, the token "
                           r"embedding \(token_embd.weight\) 49,216 rows",
}


@pytest.mark.parametrize("name", sorted(ODD))
def test_a_broken_file_is_refused_with_its_problem(files, name):
    path = files["dir"] / name
    with pytest.raises((ValueError, NotImplementedError), match=ODD[name]) as err:
        Model.load(path, weights="dense", check_memory=False)
    assert "\n" not in str(err.value)
    info = read_model_info(path)  # the model list greys it out, saying why
    assert not info.supported and "\n" not in info.problem
    if name != "unknown-arch.gguf" and name != "vocab-mismatch.gguf":
        with pytest.raises(ValueError):
            Tokenizer.load(path)


def test_the_cli_says_it_in_one_line(files):
    for name in ("truncated.gguf", "vocab-mismatch.gguf", "empty.gguf"):
        run = subprocess.run([sys.executable, "-m", "engine", "generate", "--model", str(files["dir"] / name),
                              "--prompt", "hi", "--max-new-tokens", "1", "--weights", "dense"],
                             cwd=ROOT, capture_output=True, text=True, timeout=300)
        lines = run.stderr.strip().splitlines()
        assert run.returncode == 1 and len(lines) == 1 and lines[0].startswith("error: "), run.stderr
        assert __import__("re").search(ODD[name], lines[0]), lines[0]


def test_the_app_and_pagedeck_run_name_the_file_once(files):
    """The header stage (what the app and `pagedeck run` load through) and the CLI around it add the path only
    where the reader's own message lacks it."""
    for name in ("truncated.gguf", "empty.gguf", "zip-renamed.gguf"):
        path = files["dir"] / name
        with pytest.raises(ValueError, match=ODD[name]) as err:
            load_model_and_tokenizer(path, weights="dense")
        assert str(err.value).count(str(path)) == 1, str(err.value)
        run = subprocess.run([sys.executable, "-m", "app", "run", str(path), "hi"], cwd=ROOT,
                             capture_output=True, text=True, timeout=300)
        assert run.returncode == 1 and run.stderr.count(str(path)) == 1, run.stderr
        assert run.stderr.startswith("pagedeck: could not load the model: "), run.stderr


def test_a_split_set_loads_as_one_model(files):
    split, good = files["split"], files["good"]
    assert split.name == "tiny-00001-of-00003.gguf"
    parts = sorted(split.parent.glob("*.gguf"))
    assert len(parts) == 3
    whole = Model.load(good, weights="dense", check_memory=False)
    joined = Model.load(split, weights="dense", check_memory=False)
    ids = Tokenizer.load(split).encode("The split model reads every part.")
    assert torch.equal(forward_tokens(joined, ids), forward_tokens(whole, ids))
    info = read_model_info(split)
    assert info.supported and info.file_bytes == sum(p.stat().st_size for p in parts)
    assert len(info.tensors) == len(read_model_info(good).tensors)
    found = discovery.find_models([split.parent], env={}, home=split.parent, cache_tokens=1024)
    assert [m.path.name for m in found] == [split.name]  # the set once, by its first file


def test_a_split_set_refuses_a_later_part_and_a_missing_part(files, tmp_path):
    split = files["split"]
    second = split.with_name("tiny-00002-of-00003.gguf")
    with pytest.raises(ValueError, match="tiny-00002-of-00003.gguf is part 2 of a model split across 3 files; "
                                         "open its first file, tiny-00001-of-00003.gguf"):
        Model.load(second, weights="dense", check_memory=False)
    incomplete = tmp_path / "set"
    incomplete.mkdir()
    for p in (split, second):
        (incomplete / p.name).write_bytes(p.read_bytes())
    with pytest.raises(ValueError, match="is split across 3 files and 1 of them are missing: tiny-00003-of-00003.gguf"):
        Model.load(incomplete / split.name, weights="dense", check_memory=False)
    assert "missing: tiny-00003-of-00003.gguf" in read_model_info(incomplete / split.name).problem


def test_llama_cpp_reads_the_same_split_set_alike(files):
    """llama.cpp runs in a process of its own: a crash in the native library fails this test, not the suite
    (loaded beside the suite's other native libraries it has crashed in-process)."""
    import json
    import subprocess
    import sys

    import numpy as np

    pytest.importorskip("llama_cpp")
    split = files["split"]
    tok = Tokenizer.load(split)
    ids = tok.encode("Split files load the same.")[0].tolist()
    out = split.parent / "llama_cpp_scores.npy"
    script = ("import json, sys, numpy, llama_cpp\n"
              "path, ids, out = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]\n"
              "peer = llama_cpp.Llama(path, n_ctx=64, logits_all=True, verbose=False)\n"
              "peer.eval(ids)\n"
              "numpy.save(out, numpy.asarray(peer.scores[: len(ids)], dtype=numpy.float32))\n")
    proc = subprocess.run([sys.executable, "-c", script, str(split), json.dumps(ids), str(out)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    theirs = torch.from_numpy(np.load(out))
    ours = forward_tokens(Model.load(split, weights="dense", check_memory=False), torch.tensor([ids]))
    assert ours.shape == theirs.shape
    # llama.cpp multiplies Q8_0 weights by Q8_0-quantized activations: close, not bit-equal
    assert torch.corrcoef(torch.stack([ours.flatten(), theirs.flatten()]))[0, 1] > 0.99
