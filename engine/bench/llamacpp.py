"""The llama.cpp side of `python -m engine bench --peer llama.cpp`: the same GGUF and token ids through
llama-cpp-python's low-level API, the way a llama.cpp server batches chats.

- one llama_context with n_seq_max >= the stream count and a unified K/V cache; each chat is a sequence id;
- prompts go in as one llama_batch (every sequence's prompt tokens, logits only at each prompt's end), then
  one llama_decode per step carries one token per sequence (llama.cpp's multi-sequence batch API);
- greedy: the argmax of llama_get_logits_ith, as pagedeck's greedy sampler;
- a second prompt that shares a prefix keeps that prefix's K/V (llama_memory_seq_rm of the rest only), as
  llama-server's prompt cache does, so "TTFT cached" means the same thing on both sides.

llama-cpp-python is an optional dependency (`pip install 'pagedeck[peers]'`); it is imported only here.
"""
from __future__ import annotations

import ctypes
import statistics
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import numpy as np

if TYPE_CHECKING:
    from .workload import Workload

MAX_BATCH = 2048  # tokens per llama_decode call (llama.cpp's default n_batch)


def _llama_cpp():
    try:
        import llama_cpp
    except ImportError:
        raise ImportError("--peer llama.cpp needs llama-cpp-python: pip install 'pagedeck[peers]' "
                          "(builds llama.cpp from source, ~6 min)") from None
    return llama_cpp


class LlamaCpp:
    """A llama.cpp context driven token by token: decode([(seq, tokens, start, want_logits)]) -> next tokens."""

    def __init__(self, path: str | Path, n_ctx: int, n_seq: int, threads: int, unified: bool = True):
        """unified=False splits n_ctx evenly between the n_seq sequences (llama-server's slots: -c / -np each),
        llama.cpp itself refusing a sequence that outgrows its share."""
        L = self.L = _llama_cpp()
        self._quiet = L.llama_log_callback(lambda level, text, user: None)  # kept: ctypes callback lifetime
        L.llama_log_set(self._quiet, ctypes.c_void_p())
        L.llama_backend_init()
        t = time.perf_counter()
        self.model = L.llama_model_load_from_file(str(path).encode(), L.llama_model_default_params())
        if not self.model:
            raise ValueError(f"llama.cpp could not load {path}")
        p = L.llama_context_default_params()
        p.n_ctx = n_ctx
        p.n_batch = MAX_BATCH
        p.n_seq_max = n_seq
        p.n_threads = p.n_threads_batch = threads
        p.kv_unified = unified  # True: one cache shared by all sequences, as pagedeck's page pool
        p.no_perf = True
        self.ctx = L.llama_init_from_model(self.model, p)
        if not self.ctx:
            raise RuntimeError("llama.cpp could not create a context")
        self.load_s = time.perf_counter() - t
        self.n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(self.model))
        self.memory = L.llama_get_memory(self.ctx)
        self.batch = L.llama_batch_init(MAX_BATCH, 0, 1)
        self.system_info = L.llama_print_system_info().decode(errors="replace")

    def close(self) -> None:
        L = self.L
        L.llama_batch_free(self.batch)
        L.llama_free(self.ctx)
        L.llama_model_free(self.model)

    def clear(self) -> None:
        self.L.llama_memory_clear(self.memory, True)

    def forget_after(self, seq: int, pos: int) -> None:
        """Drop a sequence's K/V from position `pos` on (keep its prefix, as the server's prompt cache)."""
        if not self.L.llama_memory_seq_rm(self.memory, seq, pos, -1):
            raise RuntimeError("llama.cpp could not trim the sequence")

    def decode(self, entries: list[tuple[int, list[int], int]]) -> list[int]:
        """entries: (seq id, tokens, start position); returns each entry's greedy next token. A step of more
        than MAX_BATCH tokens goes in MAX_BATCH-token calls, in order, as llama-server splits by n_batch."""
        flat = [(seq, tok, start + k, e if k == len(tokens) - 1 else -1)
                for e, (seq, tokens, start) in enumerate(entries) for k, tok in enumerate(tokens)]
        out = [0] * len(entries)
        b = self.batch
        for at in range(0, len(flat), MAX_BATCH):
            part = flat[at : at + MAX_BATCH]
            for n, (seq, tok, pos, last) in enumerate(part):
                b.token[n] = tok
                b.pos[n] = pos
                b.n_seq_id[n] = 1
                b.seq_id[n][0] = seq
                b.logits[n] = last >= 0
            b.n_tokens = len(part)
            rc = self.L.llama_decode(self.ctx, b)
            if rc != 0:
                raise RuntimeError(f"llama_decode failed ({rc})")
            for n, (_, _, _, last) in enumerate(part):
                if last >= 0:
                    out[last] = self._argmax(n)
        return out

    def logits(self, row: int) -> np.ndarray:
        """The logits of the row-th output of the last decode (a view of llama.cpp's buffer)."""
        return np.ctypeslib.as_array(self.L.llama_get_logits_ith(self.ctx, row), shape=(self.n_vocab,))

    def _argmax(self, row: int) -> int:
        return int(self.logits(row).argmax())


class LlamaCppPeer:
    """The bench's peer protocol (load once, run() = one measurement set) over a LlamaCpp context."""

    name = "llama.cpp"
    note = "llama.cpp keeps the shared prefix in the sequence's cache (as llama-server's prompt cache)"

    def __init__(self, model_arg: str | None, w: "Workload", threads: int, log: Callable[[str], None] = print):
        from ..model.weights import default_model_path

        path = Path(model_arg) if model_arg is not None else default_model_path()
        if path.suffix.lower() != ".gguf":
            raise ValueError(f"--peer llama.cpp needs a .gguf model, got {path}")
        need = max(sum(len(s) + w.new_tokens for s in w.streams), len(w.ttft_first) + 1,
                   len(w.single) + w.new_tokens)
        self.runner = LlamaCpp(path, n_ctx=-(-(need + 64) // 256) * 256, n_seq=max(8, len(w.streams)),
                               threads=threads)
        self.load_s = self.runner.load_s
        self.w, self.log = w, log
        log(f"llama.cpp: loaded {path.name} in {self.load_s:.2f} s ({self.runner.system_info.strip()})")
        log("llama.cpp: warm-up")
        self.runner.decode([(0, w.ttft_first[:256], 0)])
        self.runner.clear()

    def run(self) -> dict:
        return bench_llamacpp(self.runner, self.w, self.log)

    def close(self) -> None:
        self.runner.close()


def bench_llamacpp(runner: LlamaCpp, w: "Workload", log: Callable[[str], None] = print) -> dict:
    """One measurement set, the same definitions as engine.bench's engine side."""
    n = w.new_tokens
    log(f"llama.cpp: batch-1 decode ({len(w.single)}-token prompt, {n} new tokens)")
    runner.clear()
    tok = runner.decode([(0, w.single, 0)])[0]
    t_first = time.perf_counter()
    for i in range(n - 1):
        tok = runner.decode([(0, [tok], len(w.single) + i)])[0]
    b1 = (n - 1) / (time.perf_counter() - t_first) if n > 1 else 0.0

    log(f"llama.cpp: {len(w.streams)} concurrent streams (one llama_batch per step)")
    runner.clear()
    t0 = time.perf_counter()
    toks = runner.decode([(s, p, 0) for s, p in enumerate(w.streams)])
    t_decode = time.perf_counter()
    for i in range(n - 1):
        toks = runner.decode([(s, [toks[s]], len(p) + i) for s, p in enumerate(w.streams)])
    t_end = time.perf_counter()
    streams = len(w.streams)
    step_s = (t_end - t_decode) / (n - 1) if n > 1 else 0.0

    log("llama.cpp: TTFT with and without the shared prefix kept in the sequence's cache")
    uncached, cached = [], []
    for _ in range(3):
        runner.clear()
        t = time.perf_counter()
        runner.decode([(0, w.ttft_first, 0)])
        uncached.append(time.perf_counter() - t)
        runner.forget_after(0, w.shared_prefix)
        t = time.perf_counter()
        runner.decode([(0, w.ttft_second[w.shared_prefix:], w.shared_prefix)])
        cached.append(time.perf_counter() - t)
    runner.clear()
    return {
        "batch1_tok_s": b1,
        "streams_tok_s": streams * n / (t_end - t0),
        "streams_decode_tok_s": streams / step_s if step_s else 0.0,
        "streams_step_ms": step_s * 1000,
        "prefill_tok_s": len(w.ttft_first) / statistics.median(uncached),
        "ttft_uncached_ms": statistics.median(uncached) * 1000,
        "ttft_cached_ms": statistics.median(cached) * 1000,
        "ttft_cached_fraction": statistics.median(cached) / statistics.median(uncached),
    }
