"""Torch reference of paged attention: what the CPU engine runs and what the Triton kernels are tested
against.

One call serves decode, chunked prefill against cached pages and speculative verification: token i of
sequence b sits at position kv_lens[b] - q_len_b + i and attends to kv positions [0, that position].
Sequences with short query chunks (decode, verification) run together in one padded SDPA call; long
prefill chunks run one sequence per call so a 2048-token chunk never pads the others. GQA is folded
into the query-row dimension (queries of one KV head stacked), which avoids repeating K/V."""

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


def check_lengths(cu: list[int], lens: list[int], T: int, max_kv: int) -> None:
    """Host-side length sanity (the reference syncs anyway); a bad length would read other pages."""
    if cu[0] != 0 or cu[-1] != T:
        raise ValueError(f"cu_q must start at 0 and end at T={T}, got {cu[0]}..{cu[-1]}")
    for b, kv in enumerate(lens):
        ql = cu[b + 1] - cu[b]
        if ql < 1 or ql > kv or kv > max_kv:
            raise ValueError(f"sequence {b}: q_len {ql}, kv_len {kv} invalid (need 1 <= q_len <= kv_len <= {max_kv})")


def _buffer(slot: int, n: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Reused gather buffer: large fresh CPU allocations are mmapped and page-fault on every step."""
    bufs = getattr(_scratch, "bufs", None)
    if bufs is None:
        bufs = _scratch.bufs = {}
    key = (slot, dtype, device)
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


def _attend(out, q, k_cache, v_cache, block_table, seqs, cu, q_lens, lens, scale) -> None:
    """Attention for a group of sequences, padded to the group's longest query and kv length."""
    T, Hq, D = q.shape
    ps, Hkv = k_cache.shape[1], k_cache.shape[2]
    G = Hq // Hkv
    Bg = len(seqs)
    qmax = max(q_lens[b] for b in seqs)
    L = max(lens[b] for b in seqs)
    npages = -(-L // ps)
    dev = q.device
    sel = torch.tensor(seqs, device=dev)
    pages = block_table.index_select(0, sel)[:, :npages].to(torch.int64)
    K = _gather(k_cache, pages, q.dtype, 0)
    V = _gather(v_cache, pages, q.dtype, 1)
    if Bg == 1:
        K, V = K[:, :L], V[:, :L]
    else:
        for j, b in enumerate(seqs):  # unwritten slots may hold anything (NaN); 0 * NaN would leak
            if lens[b] < K.shape[1]:
                K[j, lens[b]:] = 0
                V[j, lens[b]:] = 0
    Lk = K.shape[1]
    q_len_t = torch.tensor([q_lens[b] for b in seqs], device=dev)
    kv_t = torch.tensor([lens[b] for b in seqs], device=dev)
    start_t = torch.tensor([cu[b] for b in seqs], device=dev)
    i = torch.minimum(torch.arange(qmax, device=dev)[None, :], q_len_t[:, None] - 1)  # padded rows repeat the last
    tok = start_t[:, None] + i  # (Bg, qmax)
    pos = kv_t[:, None] - q_len_t[:, None] + i
    mask = torch.arange(Lk, device=dev)[None, None, :] <= pos[:, :, None]  # (Bg, qmax, Lk)
    Q = q[tok]  # (Bg, qmax, Hq, D)
    if qmax <= SHORT_Q:  # fold the G query heads of each KV head into rows: no K/V repeat, small mask
        Q = Q.view(Bg, qmax, Hkv, G, D).permute(0, 2, 1, 3, 4).reshape(Bg, Hkv, qmax * G, D)
        mask = mask[:, None, :, None, :].expand(Bg, 1, qmax, G, Lk).reshape(Bg, 1, qmax * G, Lk)
        if Bg == 1 and qmax == 1:
            mask = None  # a single decode token sees its whole (sliced) context
        res = F.scaled_dot_product_attention(Q, K.transpose(1, 2), V.transpose(1, 2), attn_mask=mask, scale=scale)
        res = res.view(Bg, Hkv, qmax, G, D).permute(0, 2, 1, 3, 4).reshape(Bg, qmax, Hq, D)
    else:  # long prefill chunk: folding would multiply the (q, kv) mask by G
        res = F.scaled_dot_product_attention(
            Q.transpose(1, 2), K.transpose(1, 2), V.transpose(1, 2), attn_mask=mask[:, None], scale=scale,
            enable_gqa=True,
        ).transpose(1, 2)
    if all(q_lens[b] == qmax for b in seqs):
        out[tok.reshape(-1)] = res.reshape(Bg * qmax, Hq, D)
    else:
        valid = torch.arange(qmax, device=dev)[None, :] < q_len_t[:, None]
        out[tok[valid]] = res[valid]


def paged_attention(
    q: torch.Tensor, k_cache, v_cache, block_table: torch.Tensor, cu_q: torch.Tensor,
    kv_lens: torch.Tensor, scale: float,
) -> torch.Tensor:
    """Varlen causal attention through the page table; see the module docstring. Returns (T, Hq, D)."""
    check_attention_args(q, k_cache, v_cache, block_table, cu_q, kv_lens)
    T = q.shape[0]
    if T == 0:
        return torch.empty_like(q)
    if isinstance(k_cache, QuantizedPool):  # pools hold rotated vectors (kv_quant): rotate q, un-rotate out
        out = _paged(k_cache.rotate(q).to(q.dtype), k_cache, v_cache, block_table, cu_q, kv_lens, scale)
        return v_cache.unrotate(out).to(q.dtype)
    return _paged(q, k_cache, v_cache, block_table, cu_q, kv_lens, scale)


def _paged(q, k_cache, v_cache, block_table, cu_q, kv_lens, scale) -> torch.Tensor:
    T = q.shape[0]
    out = torch.empty_like(q)
    cu = cu_q.tolist()
    lens = kv_lens.tolist()
    check_lengths(cu, lens, T, block_table.shape[1] * k_cache.shape[1])
    q_lens = [cu[b + 1] - cu[b] for b in range(len(lens))]
    short = [b for b, n in enumerate(q_lens) if n <= SHORT_Q]
    if short:
        _attend(out, q, k_cache, v_cache, block_table, short, cu, q_lens, lens, scale)
    for b, n in enumerate(q_lens):
        if n > SHORT_Q:
            _attend(out, q, k_cache, v_cache, block_table, [b], cu, q_lens, lens, scale)
    return out
