"""Torch reference of paged attention: what the CPU engine runs and what the Triton kernels are tested
against.

One call serves decode, chunked prefill against cached pages and speculative verification: token i of
sequence b sits at position kv_lens[b] - q_len_b + i and attends to kv positions [0, that position].
Sequences with short query chunks (decode, verification) run together in one padded SDPA call; long
prefill chunks run one sequence per call so a 2048-token chunk never pads the others. GQA is folded
into the query-row dimension (queries of one KV head stacked), which avoids repeating K/V.

Per-layer options (Gemma 2/3, Mistral, Phi-3): `window` W keeps only keys with position > p - W (HF's
sliding-window mask); `softcap` c replaces each score s by c * tanh(s / c) before the mask and softmax;
`sinks` (Hq,) adds one logit per head to the softmax's denominator, with no value (gpt-oss's attention
sinks: the weights of the real positions sum to less than 1). SDPA has neither, so those layers take an
explicit matmul-softmax-matmul path, the way HF's eager attention computes them."""

from __future__ import annotations

import threading

import torch
import torch.nn.functional as F

from .kv_quant import QuantizedPool

SHORT_Q = 16  # query chunks up to this length are batched together (decode, verification)

_scratch = threading.local()


def check_attention_args(q, k_cache, v_cache, block_table, cu_q, kv_lens) -> None:
    """Shape/dtype checks shared by both paths; cheap (no device sync)."""
    if q.dim() != 3:
        raise ValueError(f"paged_attention wants q (T, Hq, D), got {tuple(q.shape)}")
    if type(k_cache) is not type(v_cache) or k_cache.shape != v_cache.shape or len(k_cache.shape) != 4:
        raise ValueError("k_cache and v_cache must be pools of one kind shaped (num_pages, page_size, Hkv, D)")
    _, _, Hkv, D = k_cache.shape
    if q.shape[2] != D or q.shape[1] % Hkv:
        raise ValueError(f"q {tuple(q.shape)} does not fit the cache's (Hkv, D) = ({Hkv}, {D}): Hq must be a multiple of Hkv")
    B = kv_lens.shape[0]
    if kv_lens.dim() != 1 or cu_q.shape != (B + 1,):
        raise ValueError(f"cu_q must be (B+1,) for kv_lens (B,), got {tuple(cu_q.shape)} and {tuple(kv_lens.shape)}")
    if block_table.dim() != 2 or block_table.shape[0] != B:
        raise ValueError(f"block_table must be (B={B}, P), got {tuple(block_table.shape)}")
    for name, t in (("block_table", block_table), ("cu_q", cu_q), ("kv_lens", kv_lens)):
        if t.dtype.is_floating_point:
            raise ValueError(f"{name} must be an integer tensor, got {t.dtype}")


def check_layer_options(window: int | None, softcap: float | None) -> None:
    """A window below 1 would hide a token from itself; a cap <= 0 flips or zeroes every score."""
    if window is not None and (not isinstance(window, int) or window < 1):
        raise ValueError(f"sliding window must be a positive int or None, got {window!r}")
    if softcap is not None and not softcap > 0:
        raise ValueError(f"attention softcap must be positive or None, got {softcap!r}")


def check_lengths(cu: list[int], lens: list[int], T: int, max_kv: int) -> None:
    """Host-side length sanity (the reference syncs anyway); a bad length would read other pages."""
    if cu[0] != 0 or cu[-1] != T:
        raise ValueError(f"cu_q must start at 0 and end at T={T}, got {cu[0]}..{cu[-1]}")
    for b, kv in enumerate(lens):
        ql = cu[b + 1] - cu[b]
        if ql < 1 or ql > kv or kv > max_kv:
            raise ValueError(f"sequence {b}: q_len {ql}, kv_len {kv} invalid (need 1 <= q_len <= kv_len <= {max_kv})")


def _buffer(slot: int, n: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Reused gather buffer: large fresh CPU allocations are mmapped and page-fault on every step. One per
    inference-mode state: a buffer made under torch.inference_mode() cannot be written outside it."""
    bufs = getattr(_scratch, "bufs", None)
    if bufs is None:
        bufs = _scratch.bufs = {}
    key = (slot, dtype, device, torch.is_inference_mode_enabled())
    buf = bufs.get(key)
    if buf is None or buf.numel() < n:
        buf = bufs[key] = torch.empty(n, dtype=dtype, device=device)
    return buf[:n]


def _gather(cache, pages: torch.Tensor, dtype: torch.dtype, slot: int) -> torch.Tensor:
    """(Bg, n) page indices -> (Bg, n * page_size, Hkv, D) floats."""
    Bg, n = pages.shape
    _, ps, H, D = cache.shape
    if isinstance(cache, QuantizedPool):  # stays in the rotated basis: the caller rotates q instead
        return cache.gather_rotated(pages, dtype).reshape(Bg, n * ps, H, D)
    if cache.dtype != dtype:
        return cache[pages].to(dtype).reshape(Bg, n * ps, H, D)
    flat = cache.view(cache.shape[0], ps * H * D)
    out = _buffer(slot, Bg * n * ps * H * D, dtype, cache.device).view(Bg * n, ps * H * D)
    torch.index_select(flat, 0, pages.reshape(-1), out=out)
    return out.view(Bg, n * ps, H, D)


class _Group:
    """Sequences attended in one padded SDPA call, with every index and mask precomputed."""

    def __init__(self, seqs: list[int], table: torch.Tensor, cu: list[int], q_lens: list[int], lens: list[int],
                 page_size: int, T: int):
        dev = table.device
        self.Bg = Bg = len(seqs)
        self.qmax = qmax = max(q_lens[b] for b in seqs)
        self.L = L = max(lens[b] for b in seqs)
        npages = -(-L // page_size)
        self.pages = table[seqs[0] : seqs[0] + 1] if Bg == 1 else table.index_select(0, torch.tensor(seqs, device=dev))
        self.pages = self.pages[:, :npages].to(torch.int64)
        # sequences on consecutive pages (the usual case after defrag): K/V are views of the pool, no gather
        self.spans = None
        if Bg == 1 or qmax == 1:
            spans = []
            for b in seqs:
                n = -(-lens[b] // page_size)
                ids = table[b, :n].tolist()
                if ids != list(range(ids[0], ids[0] + n)):
                    break
                spans.append((ids[0], n, lens[b]))
            else:
                self.spans = spans
        Lk = L if Bg == 1 else npages * page_size
        q_len_t = torch.tensor([q_lens[b] for b in seqs], device=dev)
        kv_t = torch.tensor([lens[b] for b in seqs], device=dev)
        start_t = torch.tensor([cu[b] for b in seqs], device=dev)
        i = torch.minimum(torch.arange(qmax, device=dev)[None, :], q_len_t[:, None] - 1)  # padding repeats the last row
        tok = (start_t[:, None] + i).reshape(-1)
        pos = kv_t[:, None] - q_len_t[:, None] + i
        self.pos, self.Lk = pos, Lk
        self.mask = torch.arange(Lk, device=dev)[None, None, :] <= pos[:, :, None]  # (Bg, qmax, Lk)
        if Bg == 1 and qmax == 1:
            self.mask = None  # a single decode token sees its whole (sliced) context
        # unwritten slots past a sequence's length may hold anything (NaN), and 0 * NaN would leak
        beyond = (torch.arange(Lk, device=dev)[None, :] >= kv_t[:, None]).reshape(-1)
        self.beyond = beyond.nonzero().reshape(-1) if Bg > 1 and bool(beyond.any()) else None  # flat K/V rows
        padded = any(q_lens[b] != qmax for b in seqs)
        valid = (torch.arange(qmax, device=dev)[None, :] < q_len_t[:, None]).reshape(-1)
        self.src = valid.nonzero().reshape(-1) if padded else None  # valid rows of the padded result
        identity = not padded and Bg * qmax == T and cu[seqs[0]] == 0 and seqs == list(range(seqs[0], seqs[0] + Bg))
        self.tok = None if identity else tok  # q rows gathered into the padded layout (None: q already is it)
        self.dest = tok if self.src is None else tok.index_select(0, self.src)
        self._masks: dict[int | None, torch.Tensor | None] = {None: self.mask}
        self._folded: dict[tuple[int, int | None], torch.Tensor | None] = {}

    def mask_for(self, window: int | None) -> torch.Tensor | None:
        """The causal mask, narrowed to the last `window` positions of each query (cached per window)."""
        if window not in self._masks:
            m = self.mask
            if m is not None:
                m = m & (torch.arange(self.Lk, device=m.device)[None, None, :] > self.pos[:, :, None] - window)
            self._masks[window] = m
        return self._masks[window]

    def folded_mask(self, G: int, window: int | None = None) -> torch.Tensor | None:
        """The mask with each KV head's G query heads folded into rows (cached: the same for every layer)."""
        key = (G, window)
        if key not in self._folded:
            m = self.mask_for(window)
            if m is not None:
                Bg, qmax, Lk = m.shape
                m = m[:, None, :, None, :].expand(Bg, 1, qmax, G, Lk).reshape(Bg, 1, qmax * G, Lk)
            self._folded[key] = m
        return self._folded[key]


class AttentionPlan:
    """Everything about one step's attention that does not depend on the layer, built once per forward.

    Short query chunks (decode, verification) share one group; each long prefill chunk gets its own."""

    def __init__(self, block_table: torch.Tensor, cu_q: torch.Tensor, kv_lens: torch.Tensor, page_size: int):
        cu = cu_q.tolist()
        lens = kv_lens.tolist()
        self.T = T = cu[-1]
        check_lengths(cu, lens, T, block_table.shape[1] * page_size)
        self.page_size = page_size
        self.shape = (tuple(block_table.shape), len(cu))
        q_lens = [cu[b + 1] - cu[b] for b in range(len(lens))]
        short = [b for b, n in enumerate(q_lens) if n <= SHORT_Q]
        groups = [short] if short else []
        groups += [[b] for b, n in enumerate(q_lens) if n > SHORT_Q]
        self.groups = [_Group(g, block_table, cu, q_lens, lens, page_size, T) for g in groups]

    def check(self, block_table: torch.Tensor, cu_q: torch.Tensor, k_cache) -> None:
        if self.shape != (tuple(block_table.shape), cu_q.shape[0]) or k_cache.shape[1] != self.page_size:
            raise ValueError("this AttentionPlan was built for a different batch or page size")


def _sdpa(Q, K, V, mask, scale: float, softcap: float | None, gqa: bool = False,
          sinks: torch.Tensor | None = None) -> torch.Tensor:
    """SDPA, or (soft-capped scores, sinks) the same attention written out the way HF's eager path does it.
    sinks: each score row's sink logit, shaped to broadcast against the scores' (..., rows, 1)."""
    if softcap is None and sinks is None:
        return F.scaled_dot_product_attention(Q, K, V, attn_mask=mask, scale=scale, enable_gqa=gqa)
    if gqa and K.shape[1] != Q.shape[1]:
        K = K.repeat_interleave(Q.shape[1] // K.shape[1], dim=1)
        V = V.repeat_interleave(Q.shape[1] // V.shape[1], dim=1)
    s = torch.matmul(Q, K.transpose(-1, -2)) * scale
    if softcap is not None:
        s = torch.tanh(s / softcap) * softcap
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    if sinks is None:
        return torch.matmul(s.softmax(-1, dtype=torch.float32).to(Q.dtype), V)
    s = torch.cat([s, sinks.to(s.dtype).expand(*s.shape[:-1], 1)], dim=-1)
    return torch.matmul(s.softmax(-1, dtype=torch.float32)[..., :-1].to(Q.dtype), V)


def _first_kept(length: int, window: int | None) -> int:
    """First kv position a decode token at position length - 1 sees."""
    return 0 if window is None else max(0, length - window)


def _attend(q: torch.Tensor, k_cache, v_cache, g: _Group, scale: float, window: int | None = None,
            softcap: float | None = None, sinks: torch.Tensor | None = None) -> torch.Tensor:
    """One group's attention, padded to its longest query and kv length; returns (Bg * qmax, Hq, D)."""
    T, Hq, D = q.shape
    Hkv = k_cache.shape[2]
    G = Hq // Hkv
    Bg, qmax = g.Bg, g.qmax
    # each layout's sink per score row: folded rows are (position, head in group) of one KV head
    folded = None if sinks is None else sinks.view(1, Hkv, 1, G).expand(1, Hkv, qmax, G).reshape(1, Hkv, qmax * G, 1)
    views = g.spans is not None and not isinstance(k_cache, QuantizedPool) and k_cache.dtype == q.dtype
    if views and Bg > 1:  # batched decode: one small SDPA per sequence beats gathering and masking
        Q = q.view(Bg, Hkv, G, D) if g.tok is None else q.index_select(0, g.tok).view(Bg, Hkv, G, D)
        outs = []
        for j, (first, n, length) in enumerate(g.spans):
            lo = _first_kept(length, window)
            K = k_cache[first : first + n].view(1, -1, Hkv, D)[:, lo:length].transpose(1, 2)
            V = v_cache[first : first + n].view(1, -1, Hkv, D)[:, lo:length].transpose(1, 2)
            outs.append(_sdpa(Q[j : j + 1], K, V, None, scale, softcap, sinks=folded))
        return torch.cat(outs).reshape(Bg, Hq, D)
    if views:
        first, n, _ = g.spans[0]
        K = k_cache[first : first + n].view(1, -1, Hkv, D)
        V = v_cache[first : first + n].view(1, -1, Hkv, D)
    else:
        K = _gather(k_cache, g.pages, q.dtype, 0)
        V = _gather(v_cache, g.pages, q.dtype, 1)
    if Bg == 1:
        lo = _first_kept(g.L, window) if g.mask is None else 0  # a lone decode token: slice, no mask
        K, V = K[:, lo : g.L], V[:, lo : g.L]
    elif g.beyond is not None:
        K, V = K.contiguous(), V.contiguous()
        K.view(-1, Hkv * D).index_fill_(0, g.beyond, 0)
        V.view(-1, Hkv * D).index_fill_(0, g.beyond, 0)
    Q = (q if g.tok is None else q.index_select(0, g.tok)).view(Bg, qmax, Hq, D)
    if qmax <= SHORT_Q:  # fold the G query heads of each KV head into rows: no K/V repeat, small mask
        if qmax == 1:
            Q = Q.view(Bg, Hkv, G, D)
        else:
            Q = Q.view(Bg, qmax, Hkv, G, D).permute(0, 2, 1, 3, 4).reshape(Bg, Hkv, qmax * G, D)
        mask = g.folded_mask(G, window if g.mask is not None else None)
        res = _sdpa(Q, K.transpose(1, 2), V.transpose(1, 2), mask, scale, softcap, sinks=folded)
        if qmax == 1:
            return res.reshape(Bg, Hq, D)
        return res.view(Bg, Hkv, qmax, G, D).permute(0, 2, 1, 3, 4).reshape(Bg * qmax, Hq, D)
    # long prefill chunk: folding would multiply the (q, kv) mask by G
    res = _sdpa(Q.transpose(1, 2), K.transpose(1, 2), V.transpose(1, 2), g.mask_for(window)[:, None], scale,
                softcap, gqa=True, sinks=None if sinks is None else sinks.view(1, Hq, 1, 1)).transpose(1, 2)
    return res.reshape(Bg * qmax, Hq, D)


def paged_attention(
    q: torch.Tensor, k_cache, v_cache, block_table: torch.Tensor, cu_q: torch.Tensor,
    kv_lens: torch.Tensor, scale: float, plan: AttentionPlan | None = None, window: int | None = None,
    softcap: float | None = None, sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """Varlen causal attention through the page table; see the module docstring. Returns (T, Hq, D)."""
    check_layer_options(window, softcap)
    if sinks is not None and sinks.shape != (q.shape[1],):
        raise ValueError(f"attention sinks must be one logit per query head ({q.shape[1]},), got {tuple(sinks.shape)}")
    check_attention_args(q, k_cache, v_cache, block_table, cu_q, kv_lens)
    if q.shape[0] == 0:
        return torch.empty_like(q)
    if plan is None:
        plan = AttentionPlan(block_table, cu_q, kv_lens, k_cache.shape[1])
    plan.check(block_table, cu_q, k_cache)
    if q.shape[0] != plan.T:
        raise ValueError(f"q has {q.shape[0]} tokens but cu_q ends at {plan.T}")
    if isinstance(k_cache, QuantizedPool):  # pools hold rotated vectors (kv_quant): rotate q, un-rotate out
        out = _paged(k_cache.rotate(q).to(q.dtype), k_cache, v_cache, plan, scale, window, softcap, sinks)
        return v_cache.unrotate(out).to(q.dtype)
    return _paged(q, k_cache, v_cache, plan, scale, window, softcap, sinks)


def _paged(q, k_cache, v_cache, plan: AttentionPlan, scale: float, window, softcap, sinks=None) -> torch.Tensor:
    if len(plan.groups) == 1 and plan.groups[0].tok is None:  # decode-only step: the result is the output
        return _attend(q, k_cache, v_cache, plan.groups[0], scale, window, softcap, sinks)
    out = torch.empty_like(q)
    for g in plan.groups:
        res = _attend(q, k_cache, v_cache, g, scale, window, softcap, sinks)
        out.index_copy_(0, g.dest, res if g.src is None else res.index_select(0, g.src))
    return out
