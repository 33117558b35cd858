"""How far packed weights move the model from its dense form: `python -m tools.bench.weight_quality
[--weights packed,q8] [--peer llama.cpp]`.

Teacher-forced, one token per forward (the decode kernels' path), over a fixed English text: top-1
agreement with the dense model, max |logit difference| and the mean KL(dense || packed) in nats per token.
With --peer llama.cpp, llama.cpp's logits for the same GGUF and token ids are compared with the same dense
model, which shows what its own quantized arithmetic costs.
"""
from __future__ import annotations

import argparse
import json

import torch

from engine.cache.paged_cache import PagedCache
from engine.model.batch import Batch
from engine.model.model import Model
from engine.model.tokenizer import Tokenizer

TEXT = ("The history of the printing press begins in the fifteenth century, when Johannes Gutenberg combined "
        "movable metal type, oil-based inks and a wooden press. Within fifty years printing shops had spread "
        "across Europe and the cost of books fell sharply. Scholars could compare identical copies of a text, "
        "which changed how knowledge was checked and shared. Newspapers followed in the seventeenth century, and "
        "by the nineteenth century steam-powered presses printed thousands of pages an hour. Literacy rose with "
        "cheaper books, schools used printed textbooks, and governments printed laws so that citizens could read "
        "them. Today most text is read on screens, yet the habits the press created, such as page numbers, "
        "indexes and standard spelling, still shape how we write.")


def decode_logits(model: Model, ids: list[int]) -> torch.Tensor:
    """Teacher-forced logits, one token per forward (decode-sized matmuls)."""
    page = 256
    cache = PagedCache(model, max_tokens=-(-len(ids) // page) * page, page_size=page)
    pages = list(range(cache.num_pages))
    rows = [model.forward(Batch.build([([t], pos, pages)], page, [1]), cache)[0, : model.vocab_size]
            for pos, t in enumerate(ids)]
    return torch.stack(rows)


def compare(dense: torch.Tensor, other: torch.Tensor) -> dict:
    lp, lq = dense.log_softmax(-1), other.log_softmax(-1)
    return {"tokens": dense.shape[0], "top1_agreement": (dense.argmax(-1) == other.argmax(-1)).float().mean().item(),
            "max_abs_logit_diff": (dense - other).abs().max().item(),
            "kl_mean": (lp.exp() * (lp - lq)).sum(-1).mean().item()}


def llamacpp_logits(path, ids: list[int], vocab: int) -> torch.Tensor:
    """llama.cpp's logits for the same ids, one token per llama_decode."""
    from engine.bench.llamacpp import LlamaCpp

    runner = LlamaCpp(path, n_ctx=-(-(len(ids) + 1) // 256) * 256, n_seq=1, threads=torch.get_num_threads())
    try:
        rows = []
        for pos, t in enumerate(ids):
            runner.decode([(0, [t], pos)])
            rows.append(torch.from_numpy(runner.logits(0).copy())[:vocab])
        return torch.stack(rows)
    finally:
        runner.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.bench.weight_quality", description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--weights", default="packed,q8", help="packed formats to compare with dense (comma-separated)")
    ap.add_argument("--peer", choices=["llama.cpp"], help="also compare llama.cpp's logits (GGUF only)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    tok = Tokenizer.load(args.model)
    ids = tok.encode(TEXT).reshape(-1).tolist()
    dense_model = Model.load(args.model, weights="dense")
    dense = decode_logits(dense_model, ids)
    results = {}
    for fmt in [f for f in args.weights.split(",") if f]:
        results[fmt] = compare(dense, decode_logits(Model.load(args.model, weights=fmt), ids))
    if args.peer == "llama.cpp":
        results["llama.cpp"] = compare(dense, llamacpp_logits(dense_model.path, ids, dense_model.vocab_size))
    print(f"{len(ids)} tokens, teacher-forced one per step, vs weights=dense:")
    print("| weights | top-1 agreement | max abs logit diff | KL mean (nats/token) |\n| --- | --- | --- | --- |")
    for name, r in results.items():
        print(f"| {name} | {100 * r['top1_agreement']:.1f} % | {r['max_abs_logit_diff']:.2f} | {r['kl_mean']:.2e} |")
    if args.json:
        print(json.dumps(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
