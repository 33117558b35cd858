"""Paged varlen (prefill / verification) attention: every sequence's query chunk attends causally to its
earlier pages and to itself, all sequences in one launch.

Grid (query block, kv head). Query blocks are laid out without a device sync: sequence b's blocks start
at cu_q[b] // BLOCK_M + b (monotonic, and never fewer slots than the sequence needs), so the grid is
T // BLOCK_M + B and each program finds its sequence by binary search over cu_q; spare programs exit.
Each program packs BLOCK_M tokens x the G query heads of one KV head into the rows of a tile, so every
K/V tile is loaded once per KV head. A chunk's causal limit is kv_len - q_len + i: a reused (cached)
prefix is just earlier pages. Sliding-window layers skip the kv tiles before the block's window and
mask per row; soft-capped layers cap the scores (see triton_decode.scores); a layer's attention sinks join
each row's denominator at the end (triton_decode.add_sink)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .triton_decode import LOG2E, add_sink, scores
from .triton_kv import load_kv_tile, pool_args


@triton.jit
def _find_seq(cu_q, pid, B, BLOCK_M: tl.constexpr):
    lo = 0
    hi = B
    while lo < hi:
        mid = (lo + hi) // 2
        if tl.load(cu_q + mid) // BLOCK_M + mid <= pid:
            lo = mid + 1
        else:
            hi = mid
    return lo - 1


@triton.jit
def _prefill_kernel(q, s_qt, s_qh, kd, kh, ks, vd, vh, vs, s_kd, s_kh, s_ks, s_vd, s_vh, s_vs,
                    bt, s_bt, cu_q, kv_lens, out, s_ot, s_oh, sinks, qk_scale, sm_scale, softcap, window, B,
                    G: tl.constexpr, D: tl.constexpr, PS: tl.constexpr, FMT: tl.constexpr, GS: tl.constexpr,
                    BLOCK_M: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                    IEEE: tl.constexpr, SOFTCAP: tl.constexpr, SINKS: tl.constexpr):
    pid = tl.program_id(0)
    h = tl.program_id(1)
    b = _find_seq(cu_q, pid, B, BLOCK_M)
    q0 = tl.load(cu_q + b)
    q_len = tl.load(cu_q + b + 1) - q0
    m0 = (pid - (q0 // BLOCK_M + b)) * BLOCK_M
    if m0 < q_len:
        kv_len = tl.load(kv_lens + b)
        ROWS: tl.constexpr = BLOCK_M * BLOCK_G
        r = tl.arange(0, ROWS)
        tok = m0 + r // BLOCK_G
        g = r % BLOCK_G
        row_ok = (tok < q_len) & (g < G)
        pos = kv_len - q_len + tok
        d = tl.arange(0, BLOCK_D)
        qmask = row_ok[:, None] & (d[None, :] < D)
        tok_off = (q0 + tok).to(tl.int64)
        heads = h * G + g
        qt = tl.load(q + tok_off[:, None] * s_qt + heads[:, None] * s_qh + d[None, :], mask=qmask, other=0.0)
        kv_end = tl.minimum(kv_len, kv_len - q_len + m0 + BLOCK_M)
        b64 = b.to(tl.int64)
        m_i = tl.full([ROWS], float("-inf"), tl.float32)
        l_i = tl.zeros([ROWS], tl.float32)
        acc = tl.zeros([ROWS, BLOCK_D], tl.float32)
        kv_start = 0
        if window > 0:  # the block's first row sees from pos - window + 1 on; later rows see less
            kv_start = tl.maximum(kv_len - q_len + m0 - window + 1, 0) // BLOCK_N * BLOCK_N
        for n0 in range(kv_start, kv_end, BLOCK_N):
            n = n0 + tl.arange(0, BLOCK_N)
            ok = n < kv_end
            page = tl.load(bt + b64 * s_bt + n // PS, mask=ok, other=0).to(tl.int64)
            slot = page * PS + n % PS
            k = load_kv_tile(kd, kh, ks, s_kd, s_kh, s_ks, slot, h, ok, d, FMT, D, GS)
            v = load_kv_tile(vd, vh, vs, s_vd, s_vh, s_vs, slot, h, ok, d, FMT, D, GS)
            k = k.to(qt.dtype)
            v = v.to(qt.dtype)
            if IEEE:
                qk = tl.dot(qt, tl.trans(k), input_precision="ieee")
            else:
                qk = tl.dot(qt, tl.trans(k))
            visible = ok[None, :] & (n[None, :] <= pos[:, None])
            if window > 0:
                visible = visible & (n[None, :] > pos[:, None] - window)
            qk = tl.where(visible, scores(qk, qk_scale, sm_scale, softcap, SOFTCAP), float("-inf"))
            m_new = tl.maximum(m_i, tl.max(qk, 1))
            # a row can see nothing in a tile before its window starts: keep exp2 away from -inf - -inf
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            p = tl.exp2(qk - m_safe[:, None])
            alpha = tl.exp2(m_i - m_safe)
            l_i = l_i * alpha + tl.sum(p, 1)
            if IEEE:
                acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision="ieee")
            else:
                acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
            m_i = m_new
        if SINKS:
            acc, l_i = add_sink(acc, l_i, m_i, sinks, heads, row_ok)
        o = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]  # padding rows may have seen nothing
        tl.store(out + tok_off[:, None] * s_ot + heads[:, None] * s_oh + d[None, :], o.to(out.dtype.element_ty),
                 mask=qmask)


def prefill_config(head_dim: int, quantized: bool, fp32: bool) -> dict:
    """Rows (tokens x packed heads) and kv tile per program; from spill-free sm_90 compiles
    (python -m tools.bench.compile_check), not yet tuned on a GPU."""
    if head_dim > 128:
        return {"ROWS": 32, "BLOCK_N": 32, "num_warps": 8}
    if fp32:
        return {"ROWS": 64, "BLOCK_N": 32, "num_warps": 8}
    return {"ROWS": 128, "BLOCK_N": 32 if quantized else 64, "num_warps": 8}


def prefill_attention(q, k_cache, v_cache, block_table, cu_q, kv_lens, scale, block_rows=None, block_n=None, out=None,
                      window=None, softcap=None, sinks=None):
    """q (T, Hq, D) flat over B sequences (cu_q offsets). block_rows/block_n override tile sizes (tests);
    `out` is an optional preallocated (T, Hq, D) result; window/softcap/sinks as in kernels.paged_attention."""
    T, Hq, D = q.shape
    _, PS, Hkv, _ = k_cache.shape
    G = Hq // Hkv
    B = kv_lens.shape[0]
    if q.stride(-1) != 1:
        q = q.contiguous()
    if out is None:
        out = torch.empty(T, Hq, D, dtype=q.dtype, device=q.device)
    kd, kh, ks, s_kd, s_kh, s_ks, fmt, gs = pool_args(k_cache)
    vd, vh, vs, s_vd, s_vh, s_vs, _, _ = pool_args(v_cache)
    BLOCK_D = triton.next_power_of_2(D)
    BLOCK_G = triton.next_power_of_2(G)
    cfg = prefill_config(D, fmt != 0, q.dtype == torch.float32)
    BLOCK_M = max(1, (block_rows or cfg["ROWS"]) // BLOCK_G)
    BLOCK_N = block_n or cfg["BLOCK_N"]
    grid = (T // BLOCK_M + B, Hkv)
    _prefill_kernel[grid](
        q, q.stride(0), q.stride(1), kd, kh, ks, vd, vh, vs, s_kd, s_kh, s_ks, s_vd, s_vh, s_vs,
        block_table, block_table.stride(0), cu_q, kv_lens, out, out.stride(0), out.stride(1),
        out if sinks is None else sinks, scale * LOG2E, scale, float(softcap or 0.0), int(window or 0), B,
        G=G, D=D, PS=PS, FMT=fmt, GS=gs, BLOCK_M=BLOCK_M, BLOCK_G=BLOCK_G, BLOCK_N=BLOCK_N, BLOCK_D=BLOCK_D,
        IEEE=q.dtype == torch.float32, SOFTCAP=softcap is not None, SINKS=sinks is not None,
        num_warps=cfg["num_warps"],
    )
    return out
