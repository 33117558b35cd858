"""vLLM's `truncate_prompt_tokens`: a request may ask that only its prompt's last k tokens be kept.

The cut is made on the prompt's token ids after the chat template (so on a chat it can take the system
prompt and the first turns with it: a client that wants whole turns kept trims its messages itself). Null
or absent keeps the whole prompt, and a prompt longer than the context then answers the usual 400 naming
both lengths (context_length_exceeded). k must be an integer from 1 to the model's context (vLLM refuses a
larger one too); a prompt with images can't be cut (its image tokens would lose their embeddings). The
usage's prompt_tokens counts what was kept, and a completion's echo repeats the kept text.
"""
from __future__ import annotations

from typing import Any, Callable

from .errors import bad_request

FIELD = "truncate_prompt_tokens"
LENGTH_CODE = "context_length_exceeded"  # the code of every 400 about the prompt's length (OpenAI's)


def truncation_size(body: dict, max_seq_len: int) -> int | None:
    """The request's k (None: keep the whole prompt); a 400 naming the field when it is not an integer in
    [1, max_seq_len]."""
    value = body.get(FIELD)
    if value is None:
        return None
    k = int(value) if isinstance(value, float) and value.is_integer() else value
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise bad_request(f"{FIELD} must be null or an integer >= 1 (keep the prompt's last k tokens), got {value!r}",
                          FIELD)
    if k > max_seq_len:
        raise bad_request(f"{FIELD} ({k}) is greater than the model's maximum context length ({max_seq_len} tokens)",
                          FIELD, LENGTH_CODE)
    return k


def truncate_prompt(body: dict, ids: Any, prompt: str, max_seq_len: int, decode: Callable[[list[int]], str],
                    has_images: bool) -> tuple[Any, str]:
    """(ids, prompt text) with only the last k ids kept where the request asks for it and the prompt is longer;
    the text is then the kept ids decoded."""
    k = truncation_size(body, max_seq_len)
    if k is None or ids.shape[1] <= k:
        return ids, prompt
    if has_images:
        raise bad_request(f"{FIELD} can't cut a prompt with images ({ids.shape[1]} tokens, {k} asked for): their "
                          "tokens would lose the image; send fewer messages instead", FIELD, LENGTH_CODE)
    kept = ids[:, -k:]
    return kept, decode(kept[0].tolist())
