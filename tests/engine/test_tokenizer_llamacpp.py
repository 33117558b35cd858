"""GGUF tokenizers against llama.cpp's own, token for token: for each kind pagedeck rebuilds from a GGUF's
metadata (byte-level BPE under every `tokenizer.ggml.pre` it knows that llama.cpp knows too, and
SentencePiece vocabularies as Llama/Mistral, Gemma and Phi-3 files carry them), the ids of a corpus of
awkward text (unicode, CJK, code, emoji, CRLF, tabs, runs of spaces, special tokens inside text) equal
llama.cpp's `Llama(vocab_only=True).tokenize(text, add_bos, special)`, with and without special-token
parsing, BOS as each file asks.

The BPE files carry the embedded model's real SmolLM2 vocabulary and merges (49,152 tokens) under each
pre-tokenizer; the SentencePiece ones a small vocabulary learned the SentencePiece way
(tests.tiny_models.spm_vocabulary). llama.cpp runs in a subprocess (tests.oracles.llamacpp_peer)."""
from __future__ import annotations

import pytest

from engine import Tokenizer
from engine.model.tokenizer.gguf_vocab import PRE_SPLITS

pytest.importorskip("llama_cpp")

CORPUS = [
    "Hello world",
    "  leading spaces, and trailing   ",
    "a\tb\t\tc \t d",
    "line one\r\nline two\r\n\r\nend\r",
    "many      spaces          here\n\n\n   \n",
    "unicode: é ü ß Ω – “quotes” … naïve café",
    "日本語のテキストと中文字符，한국어 텍스트",
    "emoji 🙂👍🏽 🇫🇷 👨‍👩‍👧 ✔︎",
    "def f(x):\n    return x**2  # comment\n\tif x != 0: print(f'{x:>3}')\n",
    "numbers 1234567 3.14159 1,000,000 and 42nd 00007",
    "it's don't I'LL we've THEY'RE y'all",
    "mixed\u00a0nbsp and zero\u200bwidth, Ünïcödé ＦＵＬＬ ｶﾀｶﾅ",
    "",
    " ",
    "\n",
    "$$$ <<>> ^^^ ~~~ ||| +++ === ...!!! ???",
]
# special tokens inside text: parsed as one token with special=True, plain text without
BPE_SPECIAL = ["<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n", "text<|im_end|>more  <|endoftext|>"]

# llama.cpp's names (llama-vocab.cpp) among pagedeck's pre-tokenizers; "gpt2" is pagedeck's alias only
LLAMACPP_PRES = sorted(set(PRE_SPLITS) - {"gpt2"})
def bpe_gguf(path, pre: str):
    """A vocabulary-only GGUF: the default model's BPE vocabulary and merges under pre-tokenizer `pre`."""
    import gguf

    from engine.model.weights import GGUFFile, default_model_path
    from tools.models.synthetic_gguf import copy_default_tokenizer

    meta = dict(GGUFFile(default_model_path()).metadata)
    meta["tokenizer.ggml.pre"] = pre
    w = gguf.GGUFWriter(path, "llama")
    copy_default_tokenizer(w, meta, chat_template=False)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def spm_gguf(path, arch: str):
    """A vocabulary-only SentencePiece GGUF as the family's converter writes it (Gemma: no space prefix)."""
    import gguf

    from tests.tiny_models import add_spm_vocabulary

    w = gguf.GGUFWriter(path, arch)
    add_spm_vocabulary(w, arch)
    if arch.startswith("gemma"):
        w.add_add_space_prefix(False)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def spm_texts(arch: str) -> list[str]:
    from tests.tiny_models import SPM_SPECIALS

    s = SPM_SPECIALS[arch]
    return CORPUS + ([f"{s[0]}user\nHi there{s[-1]}\n{s[0]}model\n", f"text{s[-1]}  more"] if s else ["<s>hi</s>"])


@pytest.fixture(scope="module")
def cases(tmp_path_factory):
    """{case id: (gguf path, texts)} and llama.cpp's ids for each (add_bos per file, special on and off)."""
    from tests.oracles.llamacpp_peer import run_jobs

    tmp = tmp_path_factory.mktemp("vocab")
    files = {f"bpe-{pre}": (bpe_gguf(tmp / f"bpe-{pre}.gguf", pre), CORPUS + BPE_SPECIAL) for pre in LLAMACPP_PRES}
    files.update({f"spm-{arch}": (spm_gguf(tmp / f"spm-{arch}.gguf", arch), spm_texts(arch))
                  for arch in ("llama", "gemma2", "phi3")})
    jobs, keys = [], []
    for case, (path, texts) in files.items():
        for special in (False, True):
            jobs.append({"op": "tokenize", "model": str(path), "texts": texts, "add_bos": True, "special": special})
            keys.append((case, special))
    return files, dict(zip(keys, run_jobs(jobs, tmp)))


def compare(cases, case: str):
    files, results = cases
    path, texts = files[case]
    tok = Tokenizer.load(path)
    for special in (False, True):
        result = results[case, special]
        assert result["ok"], result["error"]
        for text, expected in zip(texts, result["ids"]):
            got = tok.encode(text, add_bos=tok.add_bos, encode_special_tokens=special)[0].tolist()
            assert got == expected, (text, special, [tok.decode([i], True) for i in got],
                                     [tok.decode([i], True) for i in expected])


@pytest.mark.parametrize("pre", LLAMACPP_PRES)
def test_byte_level_bpe_tokenizes_like_llama_cpp(cases, pre):
    compare(cases, f"bpe-{pre}")


@pytest.mark.parametrize("arch", ["llama", "gemma2", "phi3"])
def test_sentencepiece_tokenizes_like_llama_cpp(cases, arch):
    compare(cases, f"spm-{arch}")
