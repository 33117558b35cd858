"""Does a GGUF load and run alike in llama.cpp and pagedeck? `python -m tools.models.llamacpp_check FILE ...`
prints, per file, its tensor-type mix, both tokenizations of a short text, the teacher-forced top-1
agreement and KL of the two sides' logits over those tokens, and each side's first greedy tokens.

Random weights give near-ties that each side's rounding may flip (llama.cpp rounds activations to 8 bits for
quantized matrices), so greedy continuations of a random model can part after a step or two; the logits'
top-1 agreement and KL over the prompt are the measure (the fidelity suite's, tests/llamacpp_fidelity.py).
Needs pagedeck[peers]; both libraries run in this one process.
"""

from __future__ import annotations

import argparse
import ctypes
import time
from pathlib import Path

import numpy as np
import torch

TEXT = "The quick brown fox jumps over the lazy dog. Hello world, 1234 numbers"
THREADS = 2


def llamacpp_side(path: Path, text: str, greedy: int) -> dict:
    """llama.cpp's tokens of `text`, its logits of every position and `greedy` greedy tokens after them."""
    import llama_cpp

    keep = llama_cpp.llama_log_callback(lambda level, msg, user: None)
    llama_cpp.llama_log_set(keep, ctypes.c_void_p())
    t = time.perf_counter()
    peer = llama_cpp.Llama(str(path), vocab_only=False, n_ctx=256, n_batch=256, n_threads=THREADS,
                           n_threads_batch=THREADS, logits_all=True, verbose=False)
    load_s = time.perf_counter() - t
    try:
        ids = peer.tokenize(text.encode(), add_bos=True, special=False)
        peer.eval(ids)
        logits = np.asarray(peer.scores[: len(ids)], dtype=np.float32)
        out = []
        for _ in range(greedy):
            out.append(int(np.argmax(peer.scores[peer.n_tokens - 1])))
            peer.eval([out[-1]])
        return {"ids": ids, "logits": torch.from_numpy(logits), "greedy": out, "load_s": load_s}
    finally:
        peer.close()


def pagedeck_side(path: Path, text: str, ids: list[int], greedy: int) -> dict:
    """pagedeck's tokens of `text`, its logits of llama.cpp's tokens `ids` (packed weights, as the benchmarks
    load a GGUF) and `greedy` greedy tokens after them."""
    from engine.model.model_and_tokenizer import load_model_and_tokenizer
    from tools.logits import forward_tokens

    torch.set_num_threads(THREADS)
    t = time.perf_counter()
    model, tokenizer = load_model_and_tokenizer(path, weights="packed", device="cpu", dtype=torch.float32)
    load_s = time.perf_counter() - t
    mine = torch.as_tensor(tokenizer.encode(text)).reshape(-1).tolist()
    with torch.inference_mode():
        logits = forward_tokens(model, torch.tensor(ids))
        seq, out = list(ids), []
        for _ in range(greedy):
            out.append(int(forward_tokens(model, torch.tensor(seq))[-1].argmax()))
            seq.append(out[-1])
    return {"ids": mine, "logits": logits, "greedy": out, "load_s": load_s, "weights": model.weight_format}


def compare(theirs: torch.Tensor, ours: torch.Tensor) -> dict:
    """Top-1 agreement, mean and max KL(llama.cpp || pagedeck) per position, and the top-1 regret (how far,
    by llama.cpp's logits, pagedeck's top token is below llama.cpp's)."""
    lp, lq = theirs.double().log_softmax(-1), ours.double().log_softmax(-1)
    kl = (lp.exp() * (lp - lq)).sum(-1)
    picked = ours.argmax(-1)
    return {"top1": (theirs.argmax(-1) == picked).double().mean().item(), "kl": kl.mean().item(),
            "kl_max": kl.max().item(),
            "regret": (theirs.max(-1).values - theirs.gather(-1, picked[:, None])[:, 0]).max().item()}


def check(path: str | Path, text: str = TEXT, greedy: int = 4) -> dict:
    from tools.models._llamacpp_quantized import tensor_types, type_mix

    path = Path(path)
    theirs = llamacpp_side(path, text, greedy)
    ours = pagedeck_side(path, text, theirs["ids"], greedy)
    return {"mix": type_mix(tensor_types(path)), "llamacpp": theirs, "pagedeck": ours,
            **compare(theirs["logits"], ours["logits"])}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="+")
    ap.add_argument("--text", default=TEXT)
    ap.add_argument("--greedy", type=int, default=4, help="greedy tokens each side generates after the text")
    args = ap.parse_args(argv)
    for f in args.files:
        r = check(f, args.text, args.greedy)
        a, b = r["llamacpp"], r["pagedeck"]
        print(f"== {f} ({Path(f).stat().st_size / 1e6:.0f} MB)")
        print("\n".join("  " + line for line in r["mix"]))
        print(f"  load: llama.cpp {a['load_s']:.1f} s, pagedeck {b['load_s']:.1f} s ({b['weights']})")
        print(f"  tokens of the text: {'same' if b['ids'] in (a['ids'], a['ids'][1:]) else 'DIFFER'} "
              f"(llama.cpp {a['ids']}, pagedeck {b['ids']})")
        print(f"  logits over {len(a['ids'])} positions: top-1 agreement {100 * r['top1']:.1f} %, "
              f"KL mean {r['kl']:.2e}, max {r['kl_max']:.2e}, top-1 regret {r['regret']:.2f}")
        print(f"  greedy: llama.cpp {a['greedy']}, pagedeck {b['greedy']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
