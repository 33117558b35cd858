"""Tokenizer: GGUF-built BPE and HF folders against transformers' tokenizers; chat templates; errors."""

import copy
import json

import gguf
import jinja2
import pytest
import torch

from engine.model.tokenizer import Tokenizer
from engine.model.gguf.file import GGUFFile
from engine.model.weights import default_model_path
from tests.tiny_models import default_tokenizer, hf_default_tokenizer

TEXTS = [
    "Hello, world!",
    "What is the capital of France?",
    "  leading spaces and trailing   ",
    "numbers 2024 and 3.14159 and 1,000,000 and 007",
    "tabs\tand\nnewlines\r\nand\n\n\nblank lines",
    "héllo wörld ñandú — «quotes» … ©",
    "emoji 😀👍🏽🇫🇷 and family 👨‍👩‍👧",
    "日本語のテキスト、中文文本，한국어 텍스트",
    "def f(x):\n    return {'a': [x ** 2 for _ in range(10)]}  # comment\n",
    "It's, you're, we'll, they'd, I'M SHOUTING",
    "<|im_start|>user\nhi<|im_end|>\n<|endoftext|> and <repo_name> inline",
    "mixed<|im_end|>special",
    "a" * 300 + " " + "ab" * 50,
    "\u200b zero width \u00a0 nbsp \ufeff bom",
    "",
]

CONVERSATION = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "What is the capital of France?"},
    {"role": "assistant", "content": "Paris."},
    {"role": "user", "content": "And of Spain? 🇪🇸"},
]


@pytest.fixture(scope="module")
def tok():
    return default_tokenizer()


@pytest.fixture(scope="module")
def saved(tmp_path_factory, tok):
    folder = tmp_path_factory.mktemp("tok")
    tok.save(folder)
    return folder


# ---------------------------------------------------------------- against transformers (default GGUF)

@pytest.mark.slow
@pytest.mark.parametrize("text", TEXTS)
def test_encode_matches_transformers_gguf_tokenizer(tok, text):
    hf = hf_default_tokenizer()
    special = hf(text, add_special_tokens=False)["input_ids"]
    plain = hf(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]
    assert tok.encode(text, encode_special_tokens=True)[0].tolist() == special
    assert tok.encode(text)[0].tolist() == plain
    assert tok.decode(special, decode_special_tokens=True) == hf.decode(special, skip_special_tokens=False)
    assert tok.decode(special) == hf.decode(special, skip_special_tokens=True)


@pytest.mark.slow
def test_chat_template_matches_transformers(tok):
    hf = hf_default_tokenizer()
    for messages in (CONVERSATION, CONVERSATION[1:]):  # the second gets the template's default system prompt
        for gen in (True, False):
            expected = hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=gen)
            assert tok.apply_chat_template(messages, add_generation_prompt=gen) == expected
    assert tok.bos_token == hf.bos_token and tok.eos_token == hf.eos_token and tok.vocab_size == len(hf)


# ---------------------------------------------------------------- behaviour

@pytest.mark.parametrize("text", TEXTS)
def test_round_trip_is_exact(tok, text):
    ids = tok.encode(text)
    assert ids.dtype == torch.long and ids.shape == (1, len(ids[0]))
    assert tok.decode(ids) == text
    assert tok.decode(ids[0]) == text and tok.decode(ids[0].tolist()) == text
    assert b"".join(tok.token_bytes(i) for i in ids[0].tolist()) == text.encode()


def test_special_token_text_stays_text_unless_asked(tok):
    im_end = tok.token_to_id("<|im_end|>")
    assert im_end == tok.eos_token_id == 2
    plain = tok.encode("<|im_end|>")[0].tolist()
    assert im_end not in plain and len(plain) > 1
    assert tok.encode("<|im_end|>", encode_special_tokens=True)[0].tolist() == [im_end]
    assert tok.decode([im_end, 28120]) == tok.decode([28120])  # specials dropped by default
    assert tok.decode([im_end], decode_special_tokens=True) == "<|im_end|>"


def test_known_ids_and_digit_splitting(tok):
    # SmolLM2 splits numbers into single digits (llama.cpp's "smollm" pre-tokenizer)
    assert tok.encode("Hello world 2024")[0].tolist() == [19556, 905, 216, 34, 32, 34, 36]


def test_bos_and_stop_tokens(tok):
    assert tok.bos_token_id == 1 and tok.bos_token == "<|im_start|>"
    assert tok.encode("hi", add_bos=True)[0, 0].item() == tok.bos_token_id
    assert {tok.token_to_id("<|im_end|>"), tok.token_to_id("<|endoftext|>")} <= tok.stop_token_ids
    assert tok.token_to_id("<|im_start|>") not in tok.stop_token_ids


def test_pieces_cover_vocab_and_handle_partial_utf8(tok):
    pieces = tok.pieces
    assert len(pieces) == tok.vocab_size == 49152
    hello = tok.encode(" Paris")[0].tolist()
    assert len(hello) == 1 and pieces[hello[0]] == " Paris"
    ids = tok.encode("😀")[0].tolist()
    assert len(ids) > 1  # an emoji spans several byte tokens
    assert b"".join(tok.token_bytes(i) for i in ids) == "😀".encode()
    assert pieces[2] == "<|im_end|>"


def test_chat_template_renders_default_system_prompt(tok):
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}])
    assert text == ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
                    "<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    assert not tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=False).endswith(
        "assistant\n")


# ---------------------------------------------------------------- HF folders, save / load

def test_saved_folder_loads_identically(tok, saved):
    again = Tokenizer.load(saved)
    assert again.chat_template == tok.chat_template
    assert (again.bos_token_id, again.eos_token_id, again.vocab_size) == (tok.bos_token_id, tok.eos_token_id,
                                                                           tok.vocab_size)
    assert again.stop_token_ids == tok.stop_token_ids
    for text in TEXTS:
        for special in (False, True):
            assert torch.equal(again.encode(text, encode_special_tokens=special),
                               tok.encode(text, encode_special_tokens=special))
    assert again.apply_chat_template(CONVERSATION) == tok.apply_chat_template(CONVERSATION)


def test_saved_folder_is_readable_by_transformers(tok, saved):
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(saved)
    for text in TEXTS:
        expected = hf(text, add_special_tokens=False)["input_ids"]
        assert tok.encode(text, encode_special_tokens=True)[0].tolist() == expected
    assert hf.apply_chat_template(CONVERSATION, tokenize=False, add_generation_prompt=True) == \
        tok.apply_chat_template(CONVERSATION)


def test_folder_generation_config_eos_adds_stop_tokens(tmp_path, tok):
    tok.save(tmp_path)
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 7]}))
    assert Tokenizer.load(tmp_path).stop_token_ids >= {2, 7}


def test_folder_without_template_falls_back_to_chatml(tmp_path, tok):
    tok.save(tmp_path)
    cfg = json.loads((tmp_path / "tokenizer_config.json").read_text())
    del cfg["chat_template"]
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(cfg))
    text = Tokenizer.load(tmp_path).apply_chat_template([{"role": "user", "content": "hi"}])
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_chat_template_jinja_file_takes_precedence(tmp_path, tok):
    tok.save(tmp_path)
    (tmp_path / "chat_template.jinja").write_text("{{ bos_token }}{% for m in messages %}[{{ m['content'] }}]"
                                                  "{% endfor %}{{ eos_token }}")
    assert Tokenizer.load(tmp_path).apply_chat_template([{"role": "user", "content": "x"}]) == \
        "<|im_start|>[x]<|im_end|>"


def test_template_helpers_and_sandbox(tok):
    t = _with_template(tok, "{% if messages|length > 1 %}{{ raise_exception('one message only') }}"
                            "{% endif %}{{ strftime_now('%Y') }}|{{ messages[0] | tojson }}")
    out = t.apply_chat_template([{"role": "user", "content": "é"}])
    year, payload = out.split("|", 1)
    assert year.isdigit() and json.loads(payload) == {"role": "user", "content": "é"} and "é" in payload
    with pytest.raises(jinja2.TemplateError, match="one message only"):
        t.apply_chat_template(CONVERSATION)
    evil = _with_template(tok, "{{ messages.append(1) }}")
    with pytest.raises(jinja2.exceptions.SecurityError):
        evil.apply_chat_template([{"role": "user", "content": "x"}])
    escape = _with_template(tok, "{{ ''.__class__.__mro__[1].__subclasses__() }}")
    with pytest.raises(jinja2.exceptions.SecurityError):
        escape.apply_chat_template([])


def _with_template(tok, template):
    t = copy.copy(tok)
    t.chat_template = template
    return t


def test_setting_chat_template_recompiles(tok):
    t = _with_template(tok, "A")
    assert t.apply_chat_template([]) == "A"
    t.chat_template = "B{{ eos_token }}"
    assert t.apply_chat_template([]) == "B<|im_end|>"
    assert tok.chat_template.startswith("{% for message in messages %}")
    t.chat_template = "{% if %}"
    with pytest.raises(ValueError, match="invalid chat template"):
        t.apply_chat_template([])


# ---------------------------------------------------------------- bad input

def test_bad_paths(tmp_path):
    with pytest.raises(FileNotFoundError, match="nowhere"):
        Tokenizer.load(tmp_path / "nowhere")
    with pytest.raises(FileNotFoundError, match="tokenizer.json"):
        Tokenizer.load(tmp_path)
    (tmp_path / "tokenizer.json").write_text("{ not json")
    with pytest.raises(ValueError, match="tokenizer.json"):
        Tokenizer.load(tmp_path)


def test_bad_arguments(tok):
    with pytest.raises(TypeError, match="str"):
        tok.encode(["a", "b"])
    with pytest.raises(ValueError, match="out of range"):
        tok.decode([tok.vocab_size])
    with pytest.raises(ValueError, match="batch"):
        tok.decode(torch.zeros(2, 3, dtype=torch.long))


def _write_tokenizer_gguf(path, model, pre="smollm"):
    meta = GGUFFile(default_model_path()).metadata
    w = gguf.GGUFWriter(path, "llama")
    w.add_tokenizer_model(model)
    w.add_tokenizer_pre(pre)
    w.add_token_list(meta["tokenizer.ggml.tokens"][:300])
    w.add_token_merges(meta["tokenizer.ggml.merges"][:10])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_unsupported_gguf_tokenizers_say_so(tmp_path):
    with pytest.raises(NotImplementedError, match=r"'rwkv'.*tokenizer.json"):
        Tokenizer.load(_write_tokenizer_gguf(tmp_path / "rwkv.gguf", "rwkv"))
    with pytest.raises(NotImplementedError, match="'mystery-pre'"):
        Tokenizer.load(_write_tokenizer_gguf(tmp_path / "pre.gguf", "gpt2", pre="mystery-pre"))
    small = Tokenizer.load(_write_tokenizer_gguf(tmp_path / "ok.gguf", "gpt2"))
    assert small.vocab_size == 300 and small.decode(small.encode("Hi 12")) == "Hi 12"


def test_sentencepiece_style_folder_pieces_keep_spaces_and_bytes(tmp_path):
    """A Llama-2/Mistral-style tokenizer.json: Metaspace + byte fallback, no byte-level alphabet."""
    from tokenizers import Tokenizer as RawTokenizer
    from tokenizers import decoders, models, pre_tokenizers

    vocab = {"<s>": 0, "</s>": 1, **{f"<0x{b:02X}>": 2 + b for b in range(256)}}
    for piece in ["▁", "h", "e", "l", "o", "w", "r", "d", "▁h", "▁he", "ll", "▁hell", "▁hello", "▁w", "or", "▁wor",
                  "ld", "▁world"]:
        vocab[piece] = len(vocab)
    merges = [("▁", "h"), ("▁h", "e"), ("l", "l"), ("▁he", "ll"), ("▁hell", "o"), ("▁", "w"), ("o", "r"),
              ("▁w", "or"), ("▁wor", "ld")]
    raw = RawTokenizer(models.BPE(vocab, merges, byte_fallback=True))
    raw.pre_tokenizer = pre_tokenizers.Metaspace()
    raw.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    raw.add_special_tokens(["<s>", "</s>"])
    raw.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<s>", "eos_token": "</s>"}))
    tok = Tokenizer.load(tmp_path)
    ids = tok.encode("hello world é")[0].tolist()
    assert tok.decode(ids) == "hello world é"
    assert b"".join(tok.token_bytes(i) for i in ids) == " hello world é".encode()  # Metaspace's leading space
    assert tok.pieces[vocab["▁hello"]] == " hello" and tok.token_bytes(vocab["<0xC3>"]) == b"\xc3"
    assert tok.stop_token_ids == {1} and tok.encode("x", add_bos=True)[0, 0].item() == 0


# ---------------------------------------------------------------- SentencePiece GGUF vocabularies

SPM_TEXTS = ["Hello world", "hello world, the weather in paris is sunny today.", "  leading spaces", "a  b   c",
             "multiple lines\nsecond line\n\nthird", "unicode é ü 日本 🙂", "numbers 1234 and 42!", "",
             "The Quick Brown Fox jumps over the lazy dog."]


@pytest.mark.parametrize("arch", ["llama", "gemma2", "phi3"])
def test_sentencepiece_gguf_encodes_like_transformers(tmp_path, arch):
    """Llama-2/Mistral-, Gemma- and Phi-3-style SentencePiece vocabularies in a GGUF (no merges stored):
    ids, decoding and control tokens as transformers' own GGUF tokenizer loader gives them."""
    from transformers import AutoTokenizer

    from tests.tiny_models import SPM_SPECIALS, write_tiny_spm_gguf

    path = write_tiny_spm_gguf(tmp_path / f"{arch}.gguf", arch)
    ours = Tokenizer.load(path)
    hf = AutoTokenizer.from_pretrained(tmp_path, gguf_file=path.name)
    chat = "".join(SPM_SPECIALS[arch][:1]) + "user\nHi there" + "".join(SPM_SPECIALS[arch][-1:])
    for text in SPM_TEXTS + [chat]:
        if "  " in text:  # runs of spaces: transformers' GGUF loader departs from SentencePiece (no dummy prefix
            continue      # before a leading space, Gemma's whitespace tokens unmatched); test_tokenizer_llamacpp
        expected = hf(text, add_special_tokens=False)["input_ids"]
        got = ours.encode(text, encode_special_tokens=True)[0].tolist()
        assert got == expected, text
        assert ours.decode(got, decode_special_tokens=True) == hf.decode(expected, skip_special_tokens=False), text
        assert ours.decode(got) == hf.decode(expected, skip_special_tokens=True), text
    assert ours.add_bos and ours.bos_token == "<s>" and 2 in ours.stop_token_ids
    assert len(ours.encode("hello world")[0]) < len("hello world") / 2  # merges recovered, not bytes
