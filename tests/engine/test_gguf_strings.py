"""GGUFFile's metadata against gguf-py's own GGUFReader on files with every metadata array type, and the
vectorized string-array reader (engine.model.gguf_strings) against the sequential walk on hostile arrays."""

from __future__ import annotations

import random
import struct

import numpy as np
import pytest
from gguf import GGUFReader, GGUFValueType, GGUFWriter

from engine.model import gguf_strings
from engine.model.gguf_file import GGUFFile, SkippedArray

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
    """A real-looking vocabulary never needs the sequential walk (else the speed-up is gone unnoticed)."""
    tokens = _vocab(20000, seed=1)
    path = tmp_path / "vocab.gguf"
    _write(path, {"tokenizer.ggml.tokens": (tokens, V.STRING),
                  "tokenizer.ggml.merges": ([f"{a} {b}" for a, b in zip(tokens, tokens[1:])], V.STRING)})

    def walk(*a, **k):
        raise AssertionError("the vectorized reader fell back to the walk")

    monkeypatch.setattr(gguf_strings, "_walk", walk)
    meta = GGUFFile(path).metadata
    assert meta["tokenizer.ggml.tokens"] == tokens
    assert meta["after.string"] == "still here"


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
