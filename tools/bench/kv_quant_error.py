"""`python -m tools.bench.kv_quant_error`: logit error of the q8/q6/q4 KV caches against fp32 and fp16 caches on a
model (default: the embedded SmolLM2-135M), teacher-forced along the fp32 cache's greedy continuation so
every variant sees the same tokens. It lives in tools/ because it needs both the engine and the kernels'
pools (kernels never import the engine)."""

from __future__ import annotations

import argparse

import torch

from engine import Model, PagedCache, Tokenizer
from engine.model.batch import Batch
from kernels.kv_quant import make_pool

PROMPT = ("Explain in detail how a paged key/value cache works in a language model server, and why it helps "
          "when many users chat at once. Give examples.")


def _logits_along(model, cache, path: list[int], n_prompt: int, page_size: int, extend: int = 0) -> torch.Tensor:
    """Prefill path[:n_prompt], then feed path[n_prompt:] one token at a time; with `extend`, first append
    that many greedy tokens to `path` (in place). Returns the logits of every step."""
    pages = list(range(cache.num_pages))[::-1]  # non-contiguous page order
    rows = [model.forward(Batch.build([(path[:n_prompt], 0, pages)], page_size), cache)[:, : model.vocab_size]]
    for _ in range(extend):
        path.append(int(rows[-1][-1].argmax()))
        rows.append(model.forward(Batch.build([([path[-1]], len(path) - 1, pages)], page_size), cache)[:, : model.vocab_size])
    if extend:
        return torch.cat(rows)
    for i in range(n_prompt, len(path)):
        rows.append(model.forward(Batch.build([([path[i]], i, pages)], page_size), cache)[:, : model.vocab_size])
    return torch.cat(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default=None, help="HF folder or .gguf (default: embedded model)")
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--page-size", type=int, default=16)
    args = ap.parse_args()
    model = Model.load(args.model)
    tok = Tokenizer.load(args.model)
    ids = tok.encode(tok.apply_chat_template([{"role": "user", "content": PROMPT}]))[0].tolist()
    cfg, ps = model.config, args.page_size
    max_tokens = -(-(len(ids) + args.new_tokens + 1) // ps) * ps

    def factory(kind: str):
        def make():
            cache = PagedCache(model, max_tokens=max_tokens, page_size=ps)
            if kind != "fp32":
                q = None if kind == "fp16" else kind
                for pools in (cache.k, cache.v):
                    pools[:] = [make_pool(q, cache.num_pages, ps, cfg.num_kv_heads, cfg.head_dim, torch.float16,
                                          model.device) for _ in range(cfg.num_layers)]
            return cache
        return make

    path = list(ids)  # greedy continuation under the fp32 cache
    fp32_logits = _logits_along(model, factory("fp32")(), path, len(ids), ps, extend=args.new_tokens)
    path = path[:-1]
    print(f"prompt {len(ids)} tokens, {args.new_tokens} teacher-forced positions; continuation: "
          f"{tok.decode(path[len(ids):])!r}")
    res = {"fp32": fp32_logits[:-1]}
    res.update({k: _logits_along(model, factory(k)(), path, len(ids), ps) for k in ("fp16", "q8", "q6", "q4")})
    for kind in ("fp16", "q8", "q6", "q4"):
        for base in ("fp32", "fp16"):
            if kind == base:
                continue
            d = (res[kind] - res[base]).abs()
            top1 = (res[kind].argmax(-1) == res[base].argmax(-1)).float().mean().item()
            p, q = res[base].log_softmax(-1), res[kind].log_softmax(-1)
            kl = (p.exp() * (p - q)).sum(-1)
            print(f"{kind:5s} vs {base:5s}: max|dlogit| {d.max():.4f}  mean|dlogit| {d.mean():.5f}  "
                  f"top-1 agreement {top1 * 100:.1f}%  KL mean {kl.mean():.2e} max {kl.max():.2e}")


if __name__ == "__main__":
    main()
