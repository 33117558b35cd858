"""engine.model.gguf.header: one parse per file shared by every reader of one load (the memory estimate, the
weights, the tokenizer), and a file changed in place parsed again."""

from __future__ import annotations

import os

import pytest

from engine.model.gguf import header as gguf_header
from engine.model.gguf.file import GGUFFile, SkippedArray
from tools.models.synthetic_gguf import write_random_gguf


@pytest.fixture
def parses(monkeypatch):
    """The real parser, counted."""
    count = []
    real = gguf_header._Parser.parse

    def counted(self, stat):
        count.append(self.path)
        return real(self, stat)

    gguf_header.forget()
    monkeypatch.setattr(gguf_header._Parser, "parse", counted)
    yield count
    gguf_header.forget()


@pytest.fixture(scope="module")
def model_file(tmp_path_factory):
    return write_random_gguf(tmp_path_factory.mktemp("header") / "m.gguf", "tiny", 2, "Q8_0")


def test_model_and_tokenizer_share_one_parse(model_file, parses):
    """load_model_and_tokenizer reads the header for the memory check, the weights and (on its own thread)
    the tokenizer: once."""
    from engine.model.model_and_tokenizer import load_model_and_tokenizer

    model, tok = load_model_and_tokenizer(model_file, weights="packed")
    assert parses == [model_file]
    assert tok.vocab_size == model.config.vocab_size


def test_a_kept_header_reads_as_a_fresh_parse(model_file, parses):
    """Header-only readers get the long tokenizer arrays as SkippedArray; a full reader, from the kept parse,
    gets them decoded exactly as a parse of its own would."""
    skipped = GGUFFile(model_file, header_only=True).metadata
    full = GGUFFile(model_file).metadata
    assert len(parses) == 1
    assert isinstance(skipped["tokenizer.ggml.tokens"], SkippedArray)
    gguf_header.forget()
    fresh = GGUFFile(model_file).metadata
    assert len(parses) == 2
    assert full == fresh and isinstance(full["tokenizer.ggml.merges"][0], str)
    assert {k for k, v in skipped.items() if isinstance(v, SkippedArray)} == {
        "tokenizer.ggml.tokens", "tokenizer.ggml.token_type", "tokenizer.ggml.merges"}


def test_a_file_changed_in_place_is_parsed_again(tmp_path, parses):
    """Same inode, same size, same modification time, other header bytes (a value rewritten in place within
    one clock tick): the CRC notices, and the new value is read."""
    path = write_random_gguf(tmp_path / "m.gguf", "tiny", 1, "Q8_0")
    assert GGUFFile(path, header_only=True).metadata["general.name"].startswith("random tiny")
    stat = os.stat(path)
    data = bytearray(path.read_bytes())
    at = data.index(b"random tiny")
    with open(path, "r+b") as f:  # in place: the inode stays
        f.seek(at)
        f.write(b"RANDOM TINY")
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert os.stat(path).st_size == stat.st_size and os.stat(path).st_ino == stat.st_ino
    assert GGUFFile(path, header_only=True).metadata["general.name"].startswith("RANDOM TINY")
    assert parses.count(path) == 2
