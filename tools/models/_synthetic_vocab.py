"""Real-size tokenizer vocabularies for synthetic GGUF files: a byte-level BPE the size of Qwen 2.5's (151,936
tokens, 151,387 merges) or of gpt-oss's o200k_harmony (201,088 tokens, 199,742 merges, its special tokens at
their ids), and a SentencePiece vocabulary the size of Gemma 3's (262,144 pieces, no merges).

Both start from the embedded SmolLM2 vocabulary (real merges of English and code), so real text still
tokenizes through real merges, and grow to full size with generated entries shaped like a big vocabulary's:
CJK characters and words (three bytes each, six in byte-level BPE's alphabet), concatenations of known
tokens, and whitespace runs of up to 128 characters. Those runs matter: byte-level BPE writes a space as
the two-byte "Ġ", so a 128-space token is 256 bytes and its merge 257, past the one-byte lengths a
header reader may assume. The header therefore has a real file's size and string-length mix, which is
what loading cost depends on.
"""

from __future__ import annotations

import random

_CONTROL, _USER_DEFINED, _UNUSED, _BYTE, _UNKNOWN = 3, 4, 5, 6, 2

# Qwen 2.5's added tokens after its 151,643 regular ones: control tokens, except the tool-call pair
QWEN_ADDED = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
              "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
              "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>", "<tool_call>", "</tool_call>",
              "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>"]
_QWEN_USER_DEFINED = {"<tool_call>", "</tool_call>"}
# o200k_harmony (gpt-oss): 199,998 regular tokens, then special tokens up to 201,088, these named, the rest
# "<|reserved_N|>"; all control tokens
HARMONY_REGULAR = 199_998
HARMONY_SPECIAL = {199_998: "<|startoftext|>", 199_999: "<|endoftext|>", 200_002: "<|return|>",
                   200_003: "<|constrain|>", 200_005: "<|channel|>", 200_006: "<|start|>", 200_007: "<|end|>",
                   200_008: "<|message|>", 200_012: "<|call|>", 200_018: "<|endofprompt|>"}
GEMMA_HEAD = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>", "[multimodal]"]
GEMMA_TURNS = ["<start_of_turn>", "<end_of_turn>"]
GEMMA_TAIL = ["<start_of_image>", "<end_of_image>", "<image_soft_token>"]


def byte_alphabet() -> list[str]:
    """GPT-2's printable stand-in for each byte, in byte order (byte-level BPE's 256 base tokens)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), 256)]
    out, extra = [], 0
    for b in range(256):
        if b in keep:
            out.append(chr(b))
        else:
            out.append(chr(256 + extra))
            extra += 1
    return out


def _smollm2() -> tuple[list[str], list[str]]:
    """The embedded SmolLM2 vocabulary's regular tokens and its merges."""
    from engine.model.gguf.file import GGUFFile
    from engine.model.weights import default_model_path

    meta = GGUFFile(default_model_path()).metadata
    tokens = [t for t, k in zip(meta["tokenizer.ggml.tokens"], meta["tokenizer.ggml.token_type"]) if k == 1]
    return tokens, list(meta["tokenizer.ggml.merges"])


class _Grower:
    """A byte-level BPE vocabulary grown one merge at a time (each new token is two known ones joined)."""

    def __init__(self, tokens: list[str], merges: list[str]):
        self.tokens, self.merges, self.known = list(tokens), list(merges), set(tokens)

    def add(self, a: str, b: str) -> bool:
        if a + b in self.known or a not in self.known or b not in self.known:
            return False
        self.tokens.append(a + b)
        self.merges.append(f"{a} {b}")
        self.known.add(a + b)
        return True

    def add_chars(self, text: str, alphabet: list[str]) -> str:
        """Merges spelling `text` (one character at a time, its bytes first); returns its byte-level form."""
        done = ""
        for ch in text:
            mapped = "".join(alphabet[b] for b in ch.encode())
            for i in range(1, len(mapped)):
                self.add(mapped[:i], mapped[i])
            if done:
                self.add(done, mapped)
            done += mapped
        return done


def harmony_added(size: int = 201_088) -> list[str]:
    """o200k_harmony's special tokens after its regular ones, ids HARMONY_REGULAR up to `size`."""
    return [HARMONY_SPECIAL.get(i, f"<|reserved_{i}|>") for i in range(HARMONY_REGULAR, size)]


def bpe_vocabulary(size: int = 151_936, merges: int | None = None, seed: int = 0, longest_run: int = 128,
                   added: list[str] | None = None) -> tuple[list[str], list[int], list[str]]:
    """(tokens, token types, merges) of a Qwen-2.5-like byte-level BPE vocabulary: 256 + `merges` regular
    tokens (SmolLM2's, then whitespace runs up to `longest_run` spaces, CJK characters and words, joined
    tokens), the `added` tokens (default Qwen's 22), then unused "[PADn]" tokens up to `size`, as llama.cpp
    pads. merges None: Qwen 2.5's proportions, 549 tokens that are no merge (256 bytes, 22 added, 271
    padding), or with `added` given, every token that is not added nor a byte is a merge (no padding)."""
    qwen = added is None
    added = QWEN_ADDED if qwen else added
    if merges is None:
        merges = max(0, size - 549) if qwen else size - 256 - len(added)
    rng = random.Random(seed)
    alphabet = byte_alphabet()
    smol_tokens, smol_merges = _smollm2()
    g = _Grower([c for c in alphabet if c not in set(smol_tokens)] + smol_tokens, smol_merges)
    target = 256 + merges
    if target + len(added) > size or len(g.tokens) > target:
        raise ValueError(f"{merges} merges and {len(added)} added tokens do not fit {size} tokens")
    for space in ("Ġ", "Ċ", "ĉ"):  # spaces, newlines, tabs: runs built one more at a time
        for n in range(2, (longest_run if space == "Ġ" else 16) + 1):
            g.add(space * (n - 1), space)
    words = []
    while len(g.tokens) < target and len(words) < 12_000:  # CJK characters, then two- and three-character words
        text = "".join(chr(rng.randint(0x4E00, 0x9FFF)) for _ in range(rng.choice((1, 1, 2, 2, 3))))
        words.append(g.add_chars(text, alphabet))
    pool = g.tokens[256:]
    while len(g.tokens) < target:  # known tokens joined: a word start and a continuation
        a, b = rng.choice(pool), rng.choice(pool)
        if not b.startswith("Ġ") and len(a) + len(b) <= 24 and g.add(a, b):
            pool.append(a + b)
    tokens = g.tokens[:target] + added
    types = [1] * target + [_USER_DEFINED if qwen and t in _QWEN_USER_DEFINED else _CONTROL for t in added]
    pads = size - len(tokens)
    return tokens + [f"[PAD{len(tokens) + i}]" for i in range(pads)], types + [_UNUSED] * pads, g.merges[:merges]


def spm_vocabulary(size: int = 262_144, seed: int = 0) -> tuple[list[str], list[float], list[int]]:
    """(tokens, scores, token types) of a Gemma-3-like SentencePiece vocabulary: its control tokens, unused
    slots, whitespace runs with real spaces (user-defined, as Gemma's GGUFs store them), 256 byte-fallback
    tokens, single characters (ASCII, Latin-1, CJK), SmolLM2's tokens as text pieces ("▁" for a leading
    space), then pieces joined from known ones up to `size`. Scores fall with the id."""
    rng = random.Random(seed)
    byte_of = {c: b for b, c in enumerate(byte_alphabet())}
    head = GEMMA_HEAD + [f"<unused{i}>" for i in range(99)] + GEMMA_TURNS
    types = [_CONTROL, _CONTROL, _CONTROL, _UNKNOWN, _CONTROL, _CONTROL] + [_CONTROL] * 99 + [_CONTROL] * 2
    runs = [" " * n for n in range(2, 32)] + ["\n" * n for n in range(1, 32)] + ["\t" * n for n in range(1, 32)]
    types += [_USER_DEFINED if r[0] == " " else 1 for r in runs]
    byte_tokens = [f"<0x{b:02X}>" for b in range(256)]
    types += [_BYTE] * 256
    tokens = head + runs + byte_tokens
    known = set(tokens)
    pieces: list[str] = []

    def piece(p: str) -> None:
        if p and p not in known:
            known.add(p)
            pieces.append(p)

    for c in [*map(chr, range(0x21, 0x7F)), *map(chr, range(0xA1, 0x180)), "\u2581"]:
        piece(c)
    for c in range(0x4E00, 0x4E00 + 8000):
        piece(chr(c))
    smol, _ = _smollm2()
    for t in smol:
        try:
            text = bytes(byte_of[c] for c in t).decode("utf-8")
        except (KeyError, UnicodeDecodeError):
            continue
        controls = any(c < " " and c not in "\n\t" for c in text)  # a vocabulary's pieces hold no NUL, ESC, ...
        if text.strip() and not controls and text.count(" ") <= 1 and text.lstrip(" ") == text[text.count(" "):]:
            piece(text.replace(" ", "\u2581"))
    pool = list(pieces)
    limit = size - len(GEMMA_TAIL) - len(tokens)
    while len(pieces) < limit:
        a, b = rng.choice(pool), rng.choice(pool)
        if not b.startswith("\u2581") and len(a) + len(b) <= 16 and a + b not in known:
            piece(a + b)
            pool.append(a + b)
    tokens += pieces[:limit] + GEMMA_TAIL
    types += [1] * limit + [_CONTROL] * len(GEMMA_TAIL)
    return tokens, [-float(i) for i in range(len(tokens))], types


def add_bpe_vocabulary(w, size: int = 151_936, merges: int | None = None, seed: int = 0, pre: str = "qwen2",
                       specials: str = "qwen") -> int:
    """Write a bpe_vocabulary into a GGUFWriter, no BOS added, with specials "qwen" (Qwen 2.5's added tokens,
    as its files carry them: <|im_end|> the end of a turn) or "harmony" (o200k_harmony's, as gpt-oss's
    files carry them: <|startoftext|> BOS, <|return|> EOS, <|endoftext|> padding); returns the size."""
    if specials not in ("qwen", "harmony"):
        raise ValueError(f"specials must be 'qwen' or 'harmony', got {specials!r}")
    harmony = specials == "harmony"
    tokens, types, merge_list = bpe_vocabulary(size, merges, seed, added=harmony_added(size) if harmony else None)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merge_list)
    bos, eos, pad = (("<|startoftext|>", "<|return|>", "<|endoftext|>") if harmony
                     else ("<|endoftext|>", "<|im_end|>", "<|endoftext|>"))
    w.add_bos_token_id(tokens.index(bos))
    w.add_eos_token_id(tokens.index(eos))
    w.add_pad_token_id(tokens.index(pad))
    w.add_add_bos_token(False)
    return len(tokens)


def add_spm_vocabulary(w, size: int = 262_144, seed: int = 0) -> int:
    """Write spm_vocabulary(size, seed) into a GGUFWriter as Gemma 3's files carry it (BOS 2, EOS 1, UNK 3,
    no space prefix); returns the vocabulary's size."""
    tokens, scores, types = spm_vocabulary(size, seed)
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(2)
    w.add_eos_token_id(1)
    w.add_unk_token_id(3)
    w.add_pad_token_id(0)
    w.add_add_space_prefix(False)
    return len(tokens)
