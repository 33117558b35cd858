"""A byte-level BPE GGUF whose tokenizer.ggml.pre is "default" or missing splits text as llama.cpp's default
pre-tokenizer does (punctuation runs, GPT-2's words, digit runs cut into threes), not as GPT-2's."""

import pytest

from engine.model.tokenizer.gguf_vocab import from_gguf
from engine.model.gguf.file import GGUFFile
from tests.oracles.llamacpp_peer import run_jobs
from tools.models.synthetic_gguf import write_random_gguf

TEXTS = ["Hello, world!!! It's 2024: 1234567 items cost $99.50 (a+b=c) <tag> x^2 ~ y|z",
         "Numbers 12 123 1234 12345, don't; ... end  \n\n  spaced", "naïve café—«quotes» 3.14159 #hash @at"]


@pytest.fixture(scope="module", params=["default", ""])
def gguf_file(request, tmp_path_factory):
    return write_random_gguf(tmp_path_factory.mktemp("pre") / "m.gguf", "tiny", 1, "Q8_0", pre=request.param)


def test_default_split_is_llama_cpps(gguf_file):
    tok = from_gguf(GGUFFile(gguf_file).metadata, str(gguf_file))
    pieces = [p for p, _ in tok.pre_tokenizer.pre_tokenize_str("a 12345!!")]
    assert pieces == ["a", "Ġ", "123", "45", "!!"]  # GPT-2's split would be "a", "Ġ12345", "!!"


def test_default_pre_tokenizer_agrees_with_llama_cpp(gguf_file, tmp_path):
    pytest.importorskip("llama_cpp")
    # llama.cpp in a process of its own: its library loaded beside the suite's others has crashed it
    [result] = run_jobs([{"op": "tokenize", "model": str(gguf_file), "texts": TEXTS}], tmp_path)
    assert result["ok"], result
    tok = from_gguf(GGUFFile(gguf_file).metadata, str(gguf_file))
    for text, expected in zip(TEXTS, result["ids"]):
        assert tok.encode(text, add_special_tokens=False).ids == expected, text
