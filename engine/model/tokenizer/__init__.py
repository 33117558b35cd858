"""The tokenizer: `Tokenizer` (tokenizer: the `tokenizers` library behind an ExLlamaV2-like API, plus the
model's chat template), built from an HF folder's tokenizer.json or from a GGUF's vocabulary (gguf_vocab:
byte-level BPE or SentencePiece, whose merges spm_merges recovers from the scores).
"""
from .tokenizer import Tokenizer

__all__ = ["Tokenizer"]
