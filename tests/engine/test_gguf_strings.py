"""GGUFFile's metadata against gguf-py's own GGUFReader on files with every metadata array type; the
vectorized string-array reader (engine.model.gguf.strings) against a sequential walk on hostile arrays and
against gguf-py's string offsets; its memory bounded by the array, not by what follows it."""

from __future__ import annotations

import json
import random
import struct
import subprocess
import sys
import types

import numpy as np
import pytest
from gguf import GGUFReader, GGUFValueType, GGUFWriter

from engine.model.gguf import strings as gguf_strings
from engine.model.gguf.file import GGUFFile, SkippedArray

V = GGUFValueType
# a vocabulary-like array with what trips a length search: empty strings in a row, strings of 255 / 256 /
# 70,000 bytes (longer than the vectorized search covers), multi-byte UTF-8, a NUL inside a string
HOSTILE = (["", "", "a", "", "\u0120the", "\u2581x" * 3, "é" * 100, "z" * 255, "y" * 256, "", "mid\x00nul",
            "w" * 70000] + [f"tok{i}" for i in range(300)])
NUMERIC = {
    V.UINT8: [0, 1, 255], V.INT8: [-128, 0, 127], V.UINT16: [0, 65535, 7], V.INT16: [-32768, 32767, 0],
    V.UINT32: [0, 2**32 - 1, 5], V.INT32: [-2**31, 2**31 - 1, -1], V.FLOAT32: [0.5, -2.25, 1e30],
    V.BOOL: [True, False, True], V.UINT64: [0, 2**64 - 1, 3], V.INT64: [-2**63, 2**63 - 1, -7],
    V.FLOAT64: [0.1, -1e300, 3.5],
}


def _vocab(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    pieces = ["a", "b", "\u0120", "\u2581", "é", "漢", "\n", " ", "<", ">", "0"]
    return [f"<tok{i}>" if i % 97 == 0 else "".join(rng.choice(pieces) for _ in range(rng.randint(1, 12)))
            for i in range(n)]


def _write(path, arrays: dict[str, tuple[list, GGUFValueType]], scalars: bool = True) -> None:
    w = GGUFWriter(str(path), "llama")
    for key, (values, sub) in arrays.items():
        w.add_key_value(key, values, V.ARRAY, sub_type=sub)
    if scalars:  # values after the arrays: their offsets prove the arrays were stepped over exactly
        w.add_string("after.string", "still here")
        w.add_uint32("after.u32", 1234)
        w.add_key_value("after.nested", [[1, 2], [3]], V.ARRAY, sub_type=V.ARRAY)
    w.add_tensor("t", np.arange(64, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _reader_values(path) -> dict:
    r = GGUFReader(str(path))
    return {k: f.contents() for k, f in r.fields.items() if not k.startswith("GGUF.") and k != "after.nested"}


@pytest.mark.parametrize("header_only", [False, True])
def test_every_array_type_matches_gguf_reader(tmp_path, header_only):
    arrays = {f"tokenizer.{t.name.lower()}": ([v for _ in range(30) for v in vals], t) for t, vals in NUMERIC.items()}
    arrays["tokenizer.ggml.tokens"] = (_vocab(5000), V.STRING)
    arrays["tokenizer.hostile"] = (HOSTILE, V.STRING)
    arrays["tokenizer.short"] = (["x", "", "y"], V.STRING)
    path = tmp_path / "arrays.gguf"
    _write(path, arrays)
    ours, theirs = GGUFFile(path, header_only=header_only).metadata, _reader_values(path)
    assert set(ours) == set(theirs) | {"after.nested"}
    for key, value in theirs.items():
        if header_only and isinstance(ours[key], SkippedArray):  # long tokenizer arrays: the length only
            assert len(ours[key]) == len(value), key
            continue
        if key == "tokenizer.float32":  # the reader gives float32 values; ours are Python floats of them
            value = np.float32(value).tolist()
        assert ours[key] == value, key
    assert ours["after.nested"] == [[1, 2], [3]]
    assert header_only == isinstance(ours["tokenizer.ggml.tokens"], SkippedArray)


def test_a_vocabulary_takes_the_vectorized_path(tmp_path, monkeypatch):
    """A real-looking vocabulary is located and decoded by numpy alone: no string's length is read on its
    own and no array is decoded string by string (else the speed-up is gone unnoticed)."""
    tokens = _vocab(20000, seed=1)
    path = tmp_path / "vocab.gguf"
    _write(path, {"tokenizer.ggml.tokens": (tokens, V.STRING),
                  "tokenizer.ggml.merges": ([f"{a} {b}" for a, b in zip(tokens, tokens[1:])], V.STRING)})

    def one_by_one(*a, **k):
        raise AssertionError("the vectorized reader stepped through strings one at a time")

    monkeypatch.setattr(gguf_strings, "struct", types.SimpleNamespace(unpack_from=one_by_one, error=struct.error))
    monkeypatch.setattr(gguf_strings, "_decode_each", one_by_one)
    meta = GGUFFile(path).metadata
    assert meta["tokenizer.ggml.tokens"] == tokens
    assert meta["after.string"] == "still here"


def _reader_string_ends(path, key: str) -> tuple[int, list[int]]:
    """gguf-py's own layout of a string array: where its first length lies, and where each string ends
    (a string's end from its length part: an empty body's view has no address)."""
    r = GGUFReader(str(path))
    field = r.fields[key]
    at = lambda part: part.ctypes.data - r.data.ctypes.data  # noqa: E731
    count_part = field.parts[4]
    return at(count_part) + 8, [at(field.parts[i - 1]) + 8 + field.parts[i].size for i in field.data]


def _write_raw(path, key: str, strings: list[bytes]) -> None:
    """A GGUF holding one string array, written byte by byte (GGUFWriter refuses an empty array)."""
    kv = struct.pack("<Q", len(key)) + key.encode() + struct.pack("<IIQ", 9, 8, len(strings))
    kv += b"".join(struct.pack("<Q", len(x)) + x for x in strings)
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + kv + b"\0" * 32)


@pytest.mark.parametrize("kind", ["empty", "utf8", "262k"])
def test_string_ends_equal_gguf_readers_offsets(tmp_path, kind):
    """Where each string of an array ends, as engine.model.gguf.strings finds it, is where gguf-py's reader
    puts it: an empty array, multi-byte UTF-8 with empty and 256+-byte strings, a 262,144-entry vocabulary."""
    rng = random.Random(7)
    values = {"empty": [],
              "utf8": ["", "é", "漢字", "🙂👍🏽", "", "\u0120" * 130, "ü" * 200, "a", "", "\u2581x" * 90] * 40,
              "262k": _vocab(262_144, seed=3)}[kind]
    if kind == "262k":  # a few long whitespace runs, as byte-level BPE vocabularies hold
        for i in rng.sample(range(len(values)), 20):
            values[i] = "\u0120" * rng.randint(128, 300)
    path = tmp_path / f"{kind}.gguf"
    _write_raw(path, "tokenizer.ggml.tokens", [v.encode() for v in values])
    pos, expected = _reader_string_ends(path, "tokenizer.ggml.tokens")
    buf = path.read_bytes()
    assert gguf_strings.string_ends(buf, pos, len(values)).tolist() == expected
    assert gguf_strings.decode_strings(buf, pos, gguf_strings.string_ends(buf, pos, len(values))) == values


_HEADER_PEAK = """
import json, sys, tracemalloc
from engine.model.gguf.file import GGUFFile
tracemalloc.start()
gf = GGUFFile(sys.argv[1], header_only=True)
print(json.dumps({"peak": tracemalloc.get_traced_memory()[1], "count": len(gf.metadata["tokenizer.ggml.merges"])}))
"""


def test_reading_a_header_allocates_by_the_array_not_the_file(tmp_path):
    """A vocabulary whose last merge is 256 bytes or longer, followed by 64 MB of tensor data: reading the
    header (in a fresh process) allocates a few MB, however much data follows the array."""
    tokens = _vocab(30000, seed=2) + ["\u0120" * 64, "\u0120" * 128]
    merges = [f"{a} {b}" for a, b in zip(tokens, tokens[1:])]  # the last one: 64 + 1 + 128 * 2 bytes
    path = tmp_path / "long-merge.gguf"
    w = GGUFWriter(str(path), "llama")
    w.add_key_value("tokenizer.ggml.tokens", tokens, V.ARRAY, sub_type=V.STRING)
    w.add_key_value("tokenizer.ggml.merges", merges, V.ARRAY, sub_type=V.STRING)
    w.add_tensor("t", np.random.default_rng(0).standard_normal(16 << 20).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    out = subprocess.run([sys.executable, "-c", _HEADER_PEAK, str(path)], capture_output=True, text=True, check=True)
    result = json.loads(out.stdout)
    assert result["count"] == len(merges)
    assert result["peak"] < 16 << 20, f"reading the header allocated {result['peak'] / 2**20:.0f} MB"


def _packed(strings: list[bytes], tail: bytes) -> bytes:
    return b"".join(struct.pack("<Q", len(s)) + s for s in strings) + tail


@pytest.mark.parametrize("seed", range(16))
def test_read_strings_equals_the_walk(seed):
    """Random arrays built to fool a length search: runs of empty strings, bodies ending in zero bytes or
    holding NULs and length-like byte runs, lengths around 255/256, whatever follows the array."""
    rng = random.Random(seed)
    alphabet = [b"\x00", b"\x01", b"\x08", b"a", b"\x00" * 7, struct.pack("<Q", 3), "é".encode()]
    strings = []
    for _ in range(rng.randint(1, 400)):
        kind = rng.random()
        if kind < 0.2:
            strings.append(b"")
        elif kind < 0.25:  # 256 and up only in every fourth array: the others stay in the vectorized search
            strings.append(b"q" * rng.choice([254, 255] + ([256, 300] if seed % 4 == 0 else [])))
        else:
            nul_free = seed % 2 or rng.random() < 0.9  # NULs (and zero runs) in every other array
            parts = [rng.choice(alphabet[2:] if nul_free else alphabet) for _ in range(rng.randint(1, 6))]
            strings.append(b"".join(parts).replace(b"\x00", b"") if nul_free else b"".join(parts))
    tail = bytes(rng.choice([0, 0, 0, 1, 5, 200]) for _ in range(rng.randint(0, 64)))
    buf = bytearray(b"\xff" * 5 + _packed(strings, tail))
    end = 5 + len(_packed(strings, b""))
    try:
        expected = [s.decode("utf-8") for s in strings]
    except UnicodeDecodeError:
        with pytest.raises(UnicodeDecodeError):
            gguf_strings.read_strings(buf, 5, len(strings))
    else:
        assert gguf_strings.read_strings(buf, 5, len(strings)) == (expected, end)
    assert gguf_strings.skip_strings(buf, 5, len(strings)) == end


def test_truncated_array_is_an_error():
    buf = bytearray(_packed([b"abc", b"defg"], b""))[:-2]
    with pytest.raises(struct.error):
        gguf_strings.read_strings(buf, 0, 2)
    with pytest.raises(struct.error):
        gguf_strings.skip_strings(buf, 0, 2)
