"""TextStream against the embedded model's real byte-level BPE tokenizer.

Multi-byte characters are split over several tokens by that vocabulary (and, byte by byte, by its
single-byte tokens), so these tests see the same partial UTF-8 a generating model produces.
"""

import random

import pytest

from engine.generator.streaming import MAX_HELD_TOKENS, StreamChunk, TextStream
from tests.tiny_models import default_tokenizer

MULTIBYTE = "Emoji 😀🦙🫠 and CJK 龘䲜𠜎 done, 你好世界 — Ünïcödé ✓"


@pytest.fixture(scope="module")
def tok():
    return default_tokenizer()


@pytest.fixture(scope="module")
def byte_token(tok):
    """byte value -> id of the vocabulary's single-byte token."""
    table = {}
    for i in range(tok.vocab_size):
        b = tok.token_bytes(i)
        if len(b) == 1:
            table.setdefault(b[0], i)
    return table


def ids_of(tok, text):
    return tok.encode(text)[0].tolist()


def stream_all(stream, ids, sizes=None):
    """Feed ids (one by one, or in the given chunk sizes); return the chunks."""
    chunks, i = [], 0
    sizes = sizes or [1] * len(ids)
    for n in sizes:
        if i >= len(ids):
            break
        chunks.append(stream.feed(ids[i:i + n]))
        i += n
        if chunks[-1].stop_string is not None:
            break
    return chunks


def test_split_characters_never_stream_replacement_chars(tok):
    ids = ids_of(tok, MULTIBYTE)
    # The vocabulary really does split these characters: some tokens alone are partial UTF-8.
    assert any("\ufffd" in tok.decode([i]) for i in ids)
    stream = TextStream(tok)
    chunks = stream_all(stream, ids)
    assert all("\ufffd" not in c.text for c in chunks)
    assert "".join(c.text for c in chunks) + stream.flush() == MULTIBYTE
    # Incomplete bytes were held: some feeds emitted nothing, and every emoji came out whole.
    assert any(c.text == "" for c in chunks)
    assert {"😀", "🦙", "🫠", "𠜎"} <= {ch for c in chunks for ch in c.text}


def test_byte_by_byte_emoji_and_cjk(tok, byte_token):
    text = "a😀b龘c𠜎"
    ids = [byte_token[b] for b in text.encode()]
    stream = TextStream(tok)
    out = [stream.feed([i]).text for i in ids]
    assert "\ufffd" not in "".join(out)
    assert "".join(out) + stream.flush() == text
    # 😀 is 4 bytes: nothing is emitted for its first three, the whole character with its last.
    assert out[1:5] == ["", "", "", "😀"]


def test_text_before_an_incomplete_character_is_not_delayed(tok, byte_token):
    stream = TextStream(tok)
    hello = ids_of(tok, "Hello world")
    # One feed: complete words followed by the first two bytes of 😀.
    chunk = stream.feed(hello + [byte_token[0xF0], byte_token[0x9F]])
    assert chunk.text == "Hello world"
    assert stream.feed([byte_token[0x98]]).text == ""
    assert stream.feed([byte_token[0x80]]).text == "😀"


def test_invalid_bytes_flush_after_the_cap(tok, byte_token):
    stream = TextStream(tok)
    lone = byte_token[0xF0]  # a lead byte repeated never forms a character
    out = "".join(stream.feed([lone]).text for _ in range(MAX_HELD_TOKENS + 2))
    assert out.startswith("\ufffd")  # let through instead of held forever
    assert stream.feed(ids_of(tok, " ok")).text.endswith(" ok")


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_chunking_reproduces_the_full_decode(tok, seed):
    text = ("The quick brown fox 🦊 jumps over the lazy dog. 日本語のテキスト, 한국어 텍스트; "
            "numbers 1234567 and   spaces\n\tnew lines, émojis 👩‍👩‍👧‍👦 done.")
    ids = ids_of(tok, text)
    rng = random.Random(seed)
    sizes = [rng.randint(1, 5) for _ in ids]
    stream = TextStream(tok)
    chunks = stream_all(stream, ids, sizes)
    streamed = "".join(c.text for c in chunks)
    assert "\ufffd" not in streamed
    assert streamed + stream.flush() == tok.decode(ids) == text


def test_stop_string_spanning_tokens(tok):
    text = "Alpha beta<|stop here|> gamma delta"
    ids = ids_of(tok, text)
    stop = "a<|stop"  # starts inside "beta" and spans several tokens
    assert not any(stop in tok.decode([i]) for i in ids)
    stream = TextStream(tok, stop_strings=[stop])
    chunks = stream_all(stream, ids)
    last = chunks[-1]
    assert last.stop_string == stop
    assert "".join(c.text for c in chunks) == "Alpha bet"
    # The stop string and what was decoded after it in that feed are held, never streamed.
    assert last.held.startswith(stop)
    assert ("Alpha bet" + last.held) == tok.decode(ids[:len(chunks)])
    assert stream.finished and stream.stopped == stop
    with pytest.raises(RuntimeError, match="after the stream ended"):
        stream.feed(ids[len(chunks):])


def test_earliest_stop_string_wins(tok):
    ids = ids_of(tok, "one two three four")
    stream = TextStream(tok, stop_strings=["four", " two"])
    chunks = stream_all(stream, ids, [len(ids)])  # both complete in one feed
    assert chunks[0] == StreamChunk("one", " two", " two three four")


def test_partial_stop_prefix_is_held_then_released(tok):
    stop = "###END"
    stream = TextStream(tok, stop_strings=[stop])
    emitted = ""
    for piece, expect_held in [("Intro ", ""), ("##", "##"), ("#E", "###E"), ("x more", ""), (" ###", "###")]:
        emitted += stream.feed(ids_of(tok, piece)).text
        assert stream.held_text == expect_held, piece
        assert not emitted.endswith(("#", "#E"))  # the possible stop-string start is not on screen
    assert emitted == "Intro ###Ex more "
    chunk = stream.feed(ids_of(tok, "END tail"))
    assert chunk.stop_string == stop and chunk.text == "" and chunk.held == "###END tail"


def test_flush_returns_held_prefix_and_partial_bytes(tok, byte_token):
    stream = TextStream(tok, stop_strings=["<|end|>"])
    assert stream.feed(ids_of(tok, "done <|e")).text == "done "
    assert stream.flush() == "<|e"
    with pytest.raises(RuntimeError):
        stream.feed([1])
    stream = TextStream(tok)
    assert stream.feed(ids_of(tok, "x") + [byte_token[0xE4]]).text == "x"
    assert stream.flush() == "\ufffd"  # the end of the completion: incomplete bytes are all there is


def test_stop_string_made_of_multibyte_characters(tok, byte_token):
    stream = TextStream(tok, stop_strings=["🦙!"])
    ids = ids_of(tok, "Hi ") + [byte_token[b] for b in "🦙!🦙".encode()]
    chunks = stream_all(stream, ids)
    assert "".join(c.text for c in chunks) == "Hi "
    assert chunks[-1].stop_string == "🦙!"


def test_special_tokens_follow_decode_special_tokens(tok):
    im_end = tok.token_to_id("<|im_end|>")
    ids = ids_of(tok, "a") + [im_end] + ids_of(tok, "b")
    assert "".join(c.text for c in stream_all(TextStream(tok), ids)) == "ab"
    shown = TextStream(tok, decode_special_tokens=True)
    assert "".join(c.text for c in stream_all(shown, ids)) == "a<|im_end|>b"


def test_decoding_is_incremental(tok):
    """Each token is decoded a bounded number of times, not once per later token (O(1) amortized)."""

    class Counting:
        decoded = 0

        def decode(self, ids, decode_special_tokens=False):
            Counting.decoded += len(ids)
            return tok.decode(ids, decode_special_tokens)

    ids = ids_of(tok, MULTIBYTE * 40)
    stream = TextStream(Counting(), stop_strings=["never appears"])
    text = "".join(c.text for c in stream_all(stream, ids)) + stream.flush()
    assert text == MULTIBYTE * 40
    assert Counting.decoded <= 16 * len(ids)  # a re-decode of the whole completion would be ~len(ids)**2 / 2


def test_bad_stop_strings_are_rejected(tok):
    with pytest.raises(ValueError, match="empty stop string"):
        TextStream(tok, stop_strings=[""])
    with pytest.raises(TypeError, match="stop strings must be str"):
        TextStream(tok, stop_strings=[2])
