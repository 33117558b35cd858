"""Paged decode attention (one query token per sequence), split-KV "flash-decoding" in two stages.

Stage 1, grid (batch, kv head, split): the G query heads sharing a KV head are packed as rows of one
tile (padded to >= 16 so tl.dot is legal) and read each K/V tile once; each split covers a contiguous
range of the sequence and writes its normalized partial output plus log-sum-exp (base 2) to fp32
scratch. Stage 2, grid (batch, query head), merges the splits by LSE. With one split, stage 1 writes the
output directly. The split count needs no device sync: it comes from the block table's width (an upper
bound on the context) and the SM count, and each program sizes its range from its own kv length.

Sliding-window layers (WINDOW > 0) start each sequence's range at kv_len - WINDOW, so pages before the
window are never read; soft-capped layers (SOFTCAP) map each score s to softcap * tanh(s / softcap).
Layers with attention sinks (SINKS, gpt-oss) add each head's sink logit to the softmax's denominator where
the output is normalized: in stage 1 when it writes the output directly, else in stage 2's merge."""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from .triton_kv import load_kv_tile, pool_args
from .triton_pointwise import tanh

LOG2E = 1.4426950408889634
MIN_SPLIT_TOKENS = 256  # below this a split's fixed cost outweighs the parallelism it adds


@triton.jit
def scores(qk, qk_scale, sm_scale, softcap, SOFTCAP: tl.constexpr):
    """Raw q.k products -> base-2 softmax logits, soft-capped first where the layer asks for it."""
    if SOFTCAP:
        return softcap * tanh(qk * sm_scale / softcap) * 1.4426950408889634  # LOG2E
    return qk * qk_scale


@triton.jit
def sink_weights(m, sink_logit):
    """A sink logit (natural units, no value) joining a running softmax whose maximum is m (base 2; may be -inf):
    (alpha, w), the factor that rescales the running sums to the new maximum and the sink's share to add to the
    denominator. Elementwise: a row's scalars or a tile's vectors alike."""
    sink = sink_logit.to(tl.float32) * 1.4426950408889634  # LOG2E
    m_new = tl.maximum(m, sink)
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    return tl.exp2(m - m_safe), tl.exp2(sink - m_safe)


@triton.jit
def add_sink(acc, l_i, m_i, sinks, heads, row_ok):
    """Each row's sink folded into its running softmax (acc, l_i, maximum m_i): the denominator grows, the
    weighted values stay; returned rescaled to the new maximum."""
    alpha, w = sink_weights(m_i, tl.load(sinks + heads, mask=row_ok, other=float("-inf")))
    return acc * alpha[:, None], l_i * alpha + w


@triton.jit
def _decode_stage1(q, s_qt, s_qh, kd, kh, ks, vd, vh, vs, s_kd, s_kh, s_ks, s_vd, s_vh, s_vs,
                   bt, s_bt, kv_lens, out, s_ot, s_oh, mid_o, mid_lse, sinks, qk_scale, sm_scale, softcap, window, S,
                   G: tl.constexpr, D: tl.constexpr, PS: tl.constexpr, FMT: tl.constexpr, GS: tl.constexpr,
                   BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                   DIRECT: tl.constexpr, IEEE: tl.constexpr, SOFTCAP: tl.constexpr, SINKS: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    s = tl.program_id(2)
    kv_len = tl.load(kv_lens + b)
    lo = tl.where(window > 0, tl.maximum(kv_len - window, 0), 0)
    chunk = tl.cdiv(tl.cdiv(kv_len - lo, S), BLOCK_N) * BLOCK_N
    start = lo + s * chunk
    end = tl.minimum(start + chunk, kv_len)
    g = tl.arange(0, BLOCK_G)
    d = tl.arange(0, BLOCK_D)
    heads = h * G + g
    row_ok = g < G
    qt = tl.load(q + b * s_qt + heads[:, None] * s_qh + d[None, :], mask=row_ok[:, None] & (d[None, :] < D), other=0.0)
    m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
    for n0 in range(start, end, BLOCK_N):
        n = n0 + tl.arange(0, BLOCK_N)
        ok = n < end
        page = tl.load(bt + b * s_bt + n // PS, mask=ok, other=0).to(tl.int64)
        slot = page * PS + n % PS
        k = load_kv_tile(kd, kh, ks, s_kd, s_kh, s_ks, slot, h, ok, d, FMT, D, GS)
        v = load_kv_tile(vd, vh, vs, s_vd, s_vh, s_vs, slot, h, ok, d, FMT, D, GS)
        k = k.to(qt.dtype)
        v = v.to(qt.dtype)
        if IEEE:
            qk = tl.dot(qt, tl.trans(k), input_precision="ieee")
        else:
            qk = tl.dot(qt, tl.trans(k))
        qk = tl.where(ok[None, :], scores(qk, qk_scale, sm_scale, softcap, SOFTCAP), float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        p = tl.exp2(qk - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        if IEEE:
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision="ieee")
        else:
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    omask = row_ok[:, None] & (d[None, :] < D)
    if DIRECT:
        if SINKS:
            acc, l_i = add_sink(acc, l_i, m_i, sinks, heads, row_ok)
        o = acc / l_i[:, None]
        tl.store(out + b * s_ot + heads[:, None] * s_oh + d[None, :], o.to(out.dtype.element_ty), mask=omask)
    else:
        nonempty = start < end
        o = tl.where(nonempty, acc / tl.where(nonempty, l_i, 1.0)[:, None], 0.0)
        lse = tl.where(nonempty, m_i + tl.log2(tl.where(nonempty, l_i, 1.0)), float("-inf"))
        hq = G * tl.num_programs(1)
        row = (b * hq + heads) * S + s  # mid_o (B, Hq, S, D), mid_lse (B, Hq, S)
        tl.store(mid_o + row[:, None] * D + d[None, :], o, mask=omask)
        tl.store(mid_lse + row, lse, mask=row_ok)


@triton.jit
def _decode_stage2(mid_o, mid_lse, out, s_ot, s_oh, sinks, S, D: tl.constexpr, BLOCK_D: tl.constexpr,
                   SINKS: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    hq = tl.num_programs(1)
    d = tl.arange(0, BLOCK_D)
    dm = d < D
    row0 = (b * hq + h) * S
    m = tl.load(mid_lse + row0)  # split 0 always holds the first token, so it is finite
    acc = tl.load(mid_o + row0 * D + d, mask=dm, other=0.0)
    w_sum = 1.0
    for s in range(1, S):
        lse = tl.load(mid_lse + row0 + s)
        o = tl.load(mid_o + (row0 + s) * D + d, mask=dm, other=0.0)
        m_new = tl.maximum(m, lse)
        a = tl.exp2(m - m_new)
        w = tl.exp2(lse - m_new)
        acc = acc * a + o * w
        w_sum = w_sum * a + w
        m = m_new
    if SINKS:  # one more logit with no value: only the denominator grows
        alpha, w = sink_weights(m, tl.load(sinks + h))
        acc = acc * alpha
        w_sum = w_sum * alpha + w
    tl.store(out + b * s_ot + h * s_oh + d, (acc / w_sum).to(out.dtype.element_ty), mask=dm)


@functools.lru_cache(maxsize=8)
def _sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def decode_config(head_dim: int, quantized: bool, fp32: bool) -> dict:
    """Tile size and warps per stage-1 program. Chosen from sm_90 compiles (python -m tools.bench.compile_check):
    the largest tile that compiles without register spills; not yet tuned on a GPU."""
    block_n = 64 if head_dim <= 64 or not (quantized or fp32) else 32
    if head_dim > 128:
        block_n = 16 if quantized or fp32 else 32
    return {"BLOCK_N": block_n, "num_warps": 8}


def choose_splits(batch: int, kv_heads: int, max_context: int, sm_count: int) -> int:
    """Enough splits that batch x kv_heads x splits fills the GPU about twice, never splits shorter than
    MIN_SPLIT_TOKENS of the longest possible context."""
    if batch * kv_heads >= 2 * sm_count:
        return 1
    want = triton.cdiv(2 * sm_count, batch * kv_heads)
    return max(1, min(want, triton.cdiv(max_context, MIN_SPLIT_TOKENS), 64))


def decode_attention(q, k_cache, v_cache, block_table, kv_lens, scale, num_splits=None, block_n=None, out=None,
                     window=None, softcap=None, sinks=None):
    """q (B, Hq, D): one token per sequence. num_splits/block_n override the heuristics (tests); `out`
    is an optional preallocated (B, Hq, D) result (static buffers for CUDA graphs); window/softcap/sinks
    as in kernels.paged_attention."""
    B, Hq, D = q.shape
    _, PS, Hkv, _ = k_cache.shape
    G = Hq // Hkv
    if q.stride(-1) != 1:
        q = q.contiguous()
    if num_splits is None:
        sms = _sm_count(q.device.index or 0) if q.is_cuda else 8
        num_splits = choose_splits(B, Hkv, min(block_table.shape[1] * PS, window or 1 << 62), sms)
    if out is None:
        out = torch.empty(B, Hq, D, dtype=q.dtype, device=q.device)
    kd, kh, ks, s_kd, s_kh, s_ks, fmt, gs = pool_args(k_cache)
    vd, vh, vs, s_vd, s_vh, s_vs, _, _ = pool_args(v_cache)
    direct = num_splits == 1
    mid_o = out if direct else torch.empty(B, Hq, num_splits, D, dtype=torch.float32, device=q.device)
    mid_lse = out if direct else torch.empty(B, Hq, num_splits, dtype=torch.float32, device=q.device)
    BLOCK_D = triton.next_power_of_2(D)
    cfg = decode_config(D, fmt != 0, q.dtype == torch.float32)
    BLOCK_N = block_n or cfg["BLOCK_N"]
    _decode_stage1[(B, Hkv, num_splits)](
        q, q.stride(0), q.stride(1), kd, kh, ks, vd, vh, vs, s_kd, s_kh, s_ks, s_vd, s_vh, s_vs,
        block_table, block_table.stride(0), kv_lens, out, out.stride(0), out.stride(1), mid_o, mid_lse,
        out if sinks is None else sinks, scale * LOG2E, scale, float(softcap or 0.0), int(window or 0), num_splits,
        G=G, D=D, PS=PS, FMT=fmt, GS=gs, BLOCK_G=max(16, triton.next_power_of_2(G)), BLOCK_N=BLOCK_N,
        BLOCK_D=BLOCK_D, DIRECT=direct, IEEE=q.dtype == torch.float32, SOFTCAP=softcap is not None,
        SINKS=sinks is not None, num_warps=cfg["num_warps"],
    )
    if not direct:
        _decode_stage2[(B, Hq)](mid_o, mid_lse, out, out.stride(0), out.stride(1), out if sinks is None else sinks,
                                num_splits, D=D, BLOCK_D=BLOCK_D, SINKS=sinks is not None)
    return out
