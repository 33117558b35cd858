"""Writing ggml blocks (Q4_K, Q5_K, Q6_K with plain, not llama.cpp's search-based, quantizers; gguf.quants
for the other types): the inverse of engine.model.ggml_blocks, for the GGUFs tests and benchmarks make."""
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


def _sub_block_affine(x: torch.Tensor, levels: int):
    """Per 32-weight sub-block min/scale quantized to 6 bits under fp16 super-scales (Q4_K/Q5_K)."""
    lo = x.amin(-1).clamp(max=0)  # (nb, 8): w = s*q - m with m = -lo >= 0
    scale = (x.amax(-1) - lo) / levels
    d = (scale.amax(-1, keepdim=True) / 63).to(torch.float16).float()  # 6-bit scales under it, rounded up: no clipping
    dmin = ((-lo).amax(-1, keepdim=True) / 63).to(torch.float16).float()
    sc = torch.where(d > 0, (scale / d.clamp_min(1e-30)).ceil(), torch.zeros_like(scale)).clamp(0, 63).to(torch.uint8)
    mn = torch.where(dmin > 0, (-lo / dmin.clamp_min(1e-30)).round(), torch.zeros_like(lo)).clamp(0, 63).to(torch.uint8)
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


def quantize(t: torch.Tensor, qtype) -> np.ndarray:
    """ggml bytes of a 2-D float tensor: our writers for K-quants, gguf.quants for the rest."""
    writers = {GGMLQuantizationType.Q4_K: quantize_q4_k,
               GGMLQuantizationType.Q5_K: quantize_q5_k,
               GGMLQuantizationType.Q6_K: quantize_q6_k}
    if qtype in writers:
        return writers[qtype](t.float()).numpy()
    return gguf_quantize(t.float().numpy(), qtype)
