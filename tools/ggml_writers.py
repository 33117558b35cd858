"""Writing ggml blocks (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS with plain, not llama.cpp's search-based,
quantizers; gguf.quants for the other types): the inverse of engine.model.ggml_blocks, for the GGUFs tests and benchmarks make."""
from __future__ import annotations

import numpy as np
import torch
from gguf import GGMLQuantizationType
from gguf.quants import quantize as gguf_quantize


def _pack_scale_min(sc: torch.Tensor, mn: torch.Tensor) -> torch.Tensor:
    """Eight 6-bit scales and mins (nb, 8) -> the 12-byte layout engine.model.ggml_blocks reads."""
    out = torch.empty(sc.shape[0], 12, dtype=torch.uint8)
    out[:, 0:4] = (sc[:, 0:4] & 0x3F) | ((sc[:, 4:8] >> 4) << 6)
    out[:, 4:8] = (mn[:, 0:4] & 0x3F) | ((mn[:, 4:8] >> 4) << 6)
    out[:, 8:12] = (sc[:, 4:8] & 0x0F) | ((mn[:, 4:8] & 0x0F) << 4)
    return out


def _nibbles_to_bytes(q: torch.Tensor) -> torch.Tensor:
    """(nb, 8, 32) codes < 16 -> (nb, 128) bytes, the inverse of ggml_blocks' nibble reading."""
    q = q.reshape(-1, 4, 2, 32)
    return (q[:, :, 0] | (q[:, :, 1] << 4)).reshape(-1, 128)


def _half_bytes(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.float16).reshape(-1, 1).view(torch.uint8).reshape(-1, 2)


def _sub_block_affine(x: torch.Tensor, levels: int, grid: int = 63):
    """Per sub-block (x's last dim) min/scale quantized to `grid` steps (6 bits for Q4_K/Q5_K, 4 for Q2_K) under
    fp16 super-scales."""
    lo = x.amin(-1).clamp(max=0)  # (nb, 8): w = s*q - m with m = -lo >= 0
    scale = (x.amax(-1) - lo) / levels
    d = (scale.amax(-1, keepdim=True) / grid).to(torch.float16).float()  # scales under it, rounded up: no clipping
    dmin = ((-lo).amax(-1, keepdim=True) / grid).to(torch.float16).float()
    sc = torch.where(d > 0, (scale / d.clamp_min(1e-30)).ceil(), torch.zeros_like(scale)).clamp(0, grid).to(torch.uint8)
    mn = torch.where(dmin > 0, (-lo / dmin.clamp_min(1e-30)).round(), torch.zeros_like(lo)).clamp(0, grid).to(torch.uint8)
    s, m = (d * sc.float())[..., None], (dmin * mn.float())[..., None]
    q = torch.where(s > 0, ((x + m) / s.clamp_min(1e-30)).round(), torch.zeros_like(x)).clamp(0, levels)
    return q.to(torch.uint8), d, dmin, sc, mn


def quantize_q4_k(w: torch.Tensor) -> torch.Tensor:
    """(rows, K) float -> Q4_K bytes (rows, K/256*144). A plain (not llama.cpp's search-based) quantizer."""
    x = w.float().reshape(-1, 8, 32)
    q, d, dmin, sc, mn = _sub_block_affine(x, 15)
    blocks = torch.cat([_half_bytes(d), _half_bytes(dmin), _pack_scale_min(sc, mn), _nibbles_to_bytes(q)], dim=1)
    return blocks.reshape(w.shape[0], -1)


def quantize_q5_k(w: torch.Tensor) -> torch.Tensor:
    """(rows, K) float -> Q5_K bytes (rows, K/256*176)."""
    x = w.float().reshape(-1, 8, 32)
    q, d, dmin, sc, mn = _sub_block_affine(x, 31)
    shifts = torch.arange(8, dtype=torch.uint8).view(1, 8, 1)
    qh = ((q >> 4) << shifts).sum(1, dtype=torch.uint8)  # bit j of byte l: high bit of sub-block j, weight l
    blocks = torch.cat([_half_bytes(d), _half_bytes(dmin), _pack_scale_min(sc, mn), qh,
                        _nibbles_to_bytes(q & 0x0F)], dim=1)
    return blocks.reshape(w.shape[0], -1)


def quantize_q6_k(w: torch.Tensor) -> torch.Tensor:
    """(rows, K) float -> Q6_K bytes (rows, K/256*210)."""
    x = w.float().reshape(-1, 16, 16)
    scale = x.abs().amax(-1) / 31  # (nb, 16)
    d = (scale.abs().amax(-1, keepdim=True) / 127).to(torch.float16).float()
    sc = torch.where(d > 0, (scale / d.clamp_min(1e-30)).ceil(), torch.zeros_like(scale)).clamp(-128, 127)
    s = (d * sc)[..., None]
    q = (torch.where(s != 0, (x / torch.where(s != 0, s, torch.ones_like(s))).round(), torch.zeros_like(x))
         .clamp(-32, 31).to(torch.int16) + 32).to(torch.uint8).reshape(-1, 2, 4, 32)  # per 128: 4 runs of 32
    lo = q & 0x0F
    ql = torch.cat([lo[:, :, 0] | (lo[:, :, 2] << 4), lo[:, :, 1] | (lo[:, :, 3] << 4)], dim=2).reshape(-1, 128)
    qh = ((q >> 4) << torch.tensor([0, 2, 4, 6], dtype=torch.uint8).view(1, 1, 4, 1)).sum(2, dtype=torch.uint8)
    blocks = torch.cat([ql.to(torch.uint8), qh.reshape(-1, 64), sc.to(torch.int8).view(torch.uint8), _half_bytes(d)],
                       dim=1)
    return blocks.reshape(w.shape[0], -1)


def _pairs(codes: torch.Tensor) -> torch.Tensor:
    """(nb, 2, 4, 32) codes < 4 -> (nb, 64) bytes: code of weight 128 n + 32 j + l at bits 2 j of byte 32 n + l."""
    shifts = torch.tensor([0, 2, 4, 6], dtype=torch.uint8).view(1, 1, 4, 1)
    return ((codes & 3) << shifts).sum(2, dtype=torch.uint8).reshape(-1, 64)


def quantize_q2_k(w: torch.Tensor) -> torch.Tensor:
    """(rows, K) float -> Q2_K bytes (rows, K/256*84): per 16 weights an affine step and minimum as 4-bit values
    under fp16 d and dmin (w = d*sc*q - dmin*m, codes 0..3)."""
    q, d, dmin, sc, mn = _sub_block_affine(w.float().reshape(-1, 16, 16), 3, grid=15)
    blocks = torch.cat([sc | (mn << 4), _pairs(q.reshape(-1, 2, 4, 32)), _half_bytes(d), _half_bytes(dmin)], dim=1)
    return blocks.reshape(w.shape[0], -1)


def quantize_q3_k(w: torch.Tensor) -> torch.Tensor:
    """(rows, K) float -> Q3_K bytes (rows, K/256*110): per 16 weights a scale that meets the largest-magnitude
    weight at code -4, as a 6-bit sc - 32 under an fp16 d per 256; codes 0..7 (q + 4) split into a third-bit
    plane (hmask) and 2-bit pairs. A plain, not llama.cpp's search-based, quantizer."""
    x = w.float().reshape(-1, 16, 16)
    s = _signed_max(x) / -4  # (nb, 16, 1)
    d = (s.abs().amax(1, keepdim=True) / 31).to(torch.float16).float()  # (nb, 1, 1)
    sc = torch.where(d > 0, (s / d.clamp_min(1e-30)).round(), torch.zeros_like(s)).clamp(-32, 31)
    step = d * sc
    q = torch.where(step != 0, x / torch.where(step != 0, step, torch.ones_like(step)), torch.zeros_like(x))
    codes = (q.round().clamp(-4, 3) + 4).to(torch.uint8).reshape(-1, 2, 4, 32)  # weight 128 n + 32 j + l
    qs = _pairs(codes)
    hmask = ((codes >> 2).reshape(-1, 8, 32) << torch.arange(8, dtype=torch.uint8).view(1, 8, 1)).sum(1, dtype=torch.uint8)
    u = (sc.reshape(-1, 16) + 32).to(torch.uint8)
    low = (u[:, 0:8] & 0x0F) | ((u[:, 8:16] & 0x0F) << 4)
    high = sum(((u[:, 4 * i:4 * i + 4] >> 4) & 3) << (2 * i) for i in range(4)).to(torch.uint8)
    blocks = torch.cat([hmask, qs, low, high, _half_bytes(d)], dim=1)
    return blocks.reshape(w.shape[0], -1)


_IQ4NL = torch.tensor([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], dtype=torch.float32)


def _iq4_codes(x: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """(nb, g, 32) weights and (nb, g, 1) block scales -> the 16 bytes a block of IQ4_NL's nearest table codes."""
    v = torch.where(s != 0, x / torch.where(s != 0, s, torch.ones_like(s)), torch.zeros_like(x))
    q = torch.bucketize(v, (_IQ4NL[1:] + _IQ4NL[:-1]) / 2).to(torch.uint8).reshape(*x.shape[:2], 2, 16)  # nearest
    return (q[:, :, 0] | (q[:, :, 1] << 4)).reshape(x.shape[0], -1)


def _signed_max(x: torch.Tensor) -> torch.Tensor:
    """The value of largest magnitude of each last-dim run, with its sign (keepdim)."""
    return x.gather(-1, x.abs().argmax(-1, keepdim=True))


def quantize_iq4_nl(w: torch.Tensor) -> torch.Tensor:
    """(rows, K) float -> IQ4_NL bytes (rows, K/32*18): d = the block's largest-magnitude weight / -127 (it then
    meets the table's -127 exactly), codes the nearest table values. A plain, not llama.cpp's search-based, one."""
    x = w.float().reshape(-1, 1, 32)
    d = (_signed_max(x) / -127).to(torch.float16)
    return torch.cat([_half_bytes(d), _iq4_codes(x, d.float())], dim=1).reshape(w.shape[0], -1)


def quantize_iq4_xs(w: torch.Tensor) -> torch.Tensor:
    """(rows, K) float -> IQ4_XS bytes (rows, K/256*136): per 32 a 6-bit scale ls - 32 in -32..31 under an fp16 d
    per 256, codes the nearest IQ4_NL table values. A plain quantizer, as quantize_iq4_nl."""
    x = w.float().reshape(-1, 8, 32)
    s = _signed_max(x) / -127  # (nb, 8, 1)
    d = (s.abs().amax(1, keepdim=True) / 32).to(torch.float16).float()  # (nb, 1, 1)
    ls = torch.where(d > 0, (s / d.clamp_min(1e-30)).round(), torch.zeros_like(s)).clamp(-32, 31).to(torch.int32) + 32
    ls = ls.reshape(-1, 8)
    high = sum(((ls[:, i] >> 4) & 3) << (2 * i) for i in range(8)).to(torch.int16).view(torch.uint8).reshape(-1, 2)
    low = ((ls[:, 0::2] & 15) | ((ls[:, 1::2] & 15) << 4)).to(torch.uint8)
    codes = _iq4_codes(x, d * (ls - 32).float()[..., None])
    return torch.cat([_half_bytes(d), high, low, codes], dim=1).reshape(w.shape[0], -1)


def quantize(t: torch.Tensor, qtype) -> np.ndarray:
    """ggml bytes of a 2-D float tensor: our writers for K-quants and the IQ4 types, gguf.quants for the rest."""
    writers = {GGMLQuantizationType.Q2_K: quantize_q2_k,
               GGMLQuantizationType.Q3_K: quantize_q3_k,
               GGMLQuantizationType.Q4_K: quantize_q4_k,
               GGMLQuantizationType.Q5_K: quantize_q5_k,
               GGMLQuantizationType.Q6_K: quantize_q6_k,
               GGMLQuantizationType.IQ4_NL: quantize_iq4_nl,
               GGMLQuantizationType.IQ4_XS: quantize_iq4_xs}
    if qtype in writers:
        return writers[qtype](t.float()).numpy()
    return gguf_quantize(t.float().numpy(), qtype)
