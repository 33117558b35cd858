"""The tokenizer: `Tokenizer` (tokenizer: the `tokenizers` library behind an ExLlamaV2-like API, plus the
model's chat template), built from an HF folder's tokenizer.json or from a GGUF's vocabulary (gguf_vocab:
byte-level BPE or SentencePiece, whose merges spm_merges recovers from the scores).

May import: gguf/ (the vocabulary's string arrays), weights, heap (freed memory given back), chat_format and
engine.contract; never the weights' packing or the model.
"""
from .tokenizer import Tokenizer

__all__ = ["Tokenizer"]
