"""A second `tokenizers` pipeline that reads special-token text as plain text, sharing the first one's model.

tokenizers' encode_special_tokens flag belongs to a Tokenizer instance, and flipping it on the one every
thread encodes with would race, so plain-text encoding needs an instance of its own. A serialized copy
(to_str, then from_str) rebuilds the whole BPE model: for a 262k-token vocabulary about a second of CPU,
holding the GIL all along. The twin built here instead wraps the same model object (tokenizers keeps it
behind a shared, read-locked pointer, and encoding only reads it), takes the same normalizer,
pre-tokenizer, post-processor and decoder, and re-adds the added tokens in id order: milliseconds.

The twin must encode exactly as the copy would, so it is checked against the original (same added tokens
with the same ids and flags, same size) and the serialized copy is made instead wherever the check fails or
the pipeline has settings the twin does not carry (truncation, padding).
"""

from __future__ import annotations

from tokenizers import Tokenizer as HFTokenizer


def plain_twin(tok: HFTokenizer) -> HFTokenizer:
    """An instance encoding like `tok` except that special-token text stays plain text."""
    twin = _shared(tok) if tok.truncation is None and tok.padding is None else None
    if twin is None:
        twin = HFTokenizer.from_str(tok.to_str())
    twin.encode_special_tokens = True
    return twin


def _shared(tok: HFTokenizer) -> HFTokenizer | None:
    """The twin over `tok`'s own model, or None where it would differ from `tok` in its vocabulary."""
    twin = HFTokenizer(tok.model)
    twin.normalizer, twin.pre_tokenizer = tok.normalizer, tok.pre_tokenizer
    twin.post_processor, twin.decoder = tok.post_processor, tok.decoder
    added = tok.get_added_tokens_decoder()
    run: list = []  # consecutive tokens of one kind go in one call (each call rebuilds the matcher)
    for i in sorted(added):
        if run and run[-1].special != added[i].special:
            _add(twin, run)
            run = []
        run.append(added[i])
    _add(twin, run)
    if (twin.get_added_tokens_decoder() != added
            or twin.get_vocab_size(with_added_tokens=True) != tok.get_vocab_size(with_added_tokens=True)):
        return None
    return twin


def _add(twin: HFTokenizer, tokens: list) -> None:
    if tokens:
        (twin.add_special_tokens if tokens[0].special else twin.add_tokens)(tokens)
