"""A tiny model that writes a script: its greedy reply is a text the test chose (holds no tests itself).

Random tiny models write noise, so a test can't make one think (`<think>…</think>`) or write a tool call
in its own format without forcing it by a grammar. This one is a real transformers model folder whose
weights make each next token a function of the current token only (every layer's output projections
are zero, so the residual stream is the token's embedding, and the untied lm_head maps that embedding
to the next token of the script). The script's pieces are added tokens of the tokenizer (not special,
as Qwen's `<think>` and `<tool_call>`), one token each, so the chain never repeats a token. The reply
starts from the prompt's last token (`start`, "\\n" after ChatML's `assistant`) and ends with `end`.
"""
from __future__ import annotations

import json
from pathlib import Path

LINK = 40.0  # the lm_head row of a script step is this times the step's (normed) hidden state


def write_scripted_model(folder: str | Path, script: list[str], chat_template: str, *, start: str = "\n",
                         end: str = "<|im_end|>", arch: str = "qwen3", special: tuple[str, ...] = ()) -> Path:
    """Write the model folder; `script` pieces are added as tokens (those not already single tokens);
    `special` tokens are added first, as special tokens (a vocabulary's control tokens, such as harmony's)."""
    from safetensors.torch import load_file, save_file
    from tokenizers import AddedToken, Tokenizer as HFTokenizer

    from tests.tiny_models import default_tokenizer, write_tiny_model

    folder = Path(folder)
    base = default_tokenizer()
    hf = HFTokenizer.from_str(base._tok.to_str())

    def single(text: str) -> int | None:
        ids = hf.encode(text, add_special_tokens=False).ids
        return ids[0] if len(ids) == 1 else None

    hf.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in special if single(t) is None])
    hf.add_tokens([AddedToken(p, special=False, normalized=False) for p in script if single(p) is None])
    vocab = hf.get_vocab_size(with_added_tokens=True)
    write_tiny_model(folder, arch, tie=False, vocab_size=vocab)
    hf.save(str(folder / "tokenizer.json"))
    cfg = json.loads((folder / "tokenizer_config.json").read_text())
    cfg.update(chat_template=chat_template, eos_token=end)
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg))

    ids = [single(t) for t in [start, *script, end]]
    if None in ids or len(set(ids)) != len(ids):
        raise ValueError(f"script pieces must be distinct single tokens: {[start, *script, end]}")
    path = folder / "model.safetensors"
    weights = load_file(str(path))
    for name, w in weights.items():
        if name.endswith(("o_proj.weight", "down_proj.weight", "o_proj.bias", "down_proj.bias")):
            w.zero_()
    emb = weights["model.embed_tokens.weight"]
    norm = weights["model.norm.weight"]
    head = weights["lm_head.weight"]
    for cur, nxt in zip(ids, ids[1:]):
        h = emb[cur] / emb[cur].pow(2).mean().add(1e-5).sqrt() * norm  # what the final norm makes of it
        head[nxt] = LINK * h / h.norm()
    save_file({k: v.contiguous() for k, v in weights.items()}, str(path), metadata={"format": "pt"})
    return folder
