"""ggml's K-quant blocks (Q4_K, Q5_K, Q6_K) in vectorized torch: exact decoding, the affine per-group form
the packed matmuls use, and the inverse (block writing) for making test and benchmark GGUFs.

Super-blocks hold 256 weights. Q4_K/Q5_K: fp16 d and dmin, twelve bytes packing eight 6-bit scales and
mins (one per 32 weights), then 4-bit codes (plus one high bit per weight for Q5_K): w = d*sc*q - dmin*m.
Q6_K: 4 low bits, 2 high bits, sixteen int8 scales (one per 16 weights), fp16 d: w = d*sc*(q - 32).
The decoders follow gguf's numpy reference operation for operation, so results are bit-identical.
"""

from __future__ import annotations

import functools

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import dequantize as gguf_dequantize
from gguf.quants import quantize as gguf_quantize

QK_K = 256


def _f16(b: torch.Tensor) -> torch.Tensor:
    return b.contiguous().view(torch.float16).float()


def _scale_min(scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The eight 6-bit (sc, m) pairs of Q4_K/Q5_K's 12 scale bytes, (nb, 8) each."""
    d, m, md = scales[:, 0:4], scales[:, 4:8], scales[:, 8:12]
    sc = torch.cat([d & 0x3F, (md & 0x0F) | ((d >> 2) & 0x30)], dim=1)
    mn = torch.cat([m & 0x3F, (md >> 4) | ((m >> 2) & 0x30)], dim=1)
    return sc, mn


def _low_high_nibbles(qs: torch.Tensor) -> torch.Tensor:
    """(nb, 128) bytes -> (nb, 8, 32) codes: each 32-byte run gives 32 low nibbles then 32 high ones."""
    q = qs.reshape(-1, 4, 1, 32)
    return torch.cat([q & 0x0F, q >> 4], dim=2).reshape(-1, 8, 32)


def q4_k_affine(b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Q4_K blocks (nb, 144) -> codes (nb, 8, 32) uint8, scale and min (nb, 8, 1): w = scale*q - min."""
    d, dmin = _f16(b[:, 0:2]), _f16(b[:, 2:4])
    sc, mn = _scale_min(b[:, 4:16])
    return _low_high_nibbles(b[:, 16:144]), (d * sc.float())[..., None], (dmin * mn.float())[..., None]


def q5_k_affine(b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Q5_K blocks (nb, 176) -> codes (nb, 8, 32) uint8 in 0..31, scale and min (nb, 8, 1)."""
    d, dmin = _f16(b[:, 0:2]), _f16(b[:, 2:4])
    sc, mn = _scale_min(b[:, 4:16])
    shifts = torch.arange(8, dtype=torch.uint8, device=b.device).view(1, 8, 1)
    high = (b[:, 16:48].reshape(-1, 1, 32) >> shifts) & 1
    return _low_high_nibbles(b[:, 48:176]) | (high << 4), (d * sc.float())[..., None], (dmin * mn.float())[..., None]


def q6_k_affine(b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q6_K blocks (nb, 210) -> signed codes (nb, 16, 16) int8 in -32..31 and scales (nb, 16, 1): w = s*q."""
    ql, qh = b[:, 0:128], b[:, 128:192]
    scales = b[:, 192:208].contiguous().view(torch.int8).float()
    d = _f16(b[:, 208:210])
    low = ql.reshape(-1, 2, 1, 64)
    low = torch.cat([low & 0x0F, low >> 4], dim=2).reshape(-1, 2, 4, 32)  # per 128: [l0 lo, l32 lo, l0 hi, l32 hi]
    shifts = torch.tensor([0, 2, 4, 6], dtype=torch.uint8, device=b.device).view(1, 1, 4, 1)
    high = (qh.reshape(-1, 2, 1, 32) >> shifts) & 0x03
    q = ((low | (high << 4)).to(torch.int8) - 32).reshape(-1, 16, 16)
    return q, (d * scales).reshape(-1, 16, 1)


def dequantize_q4_k(b: torch.Tensor, out: torch.Tensor) -> None:
    q, s, m = q4_k_affine(b)
    torch.sub(s * q.float(), m, out=out.view(-1, 8, 32))


def dequantize_q5_k(b: torch.Tensor, out: torch.Tensor) -> None:
    q, s, m = q5_k_affine(b)
    torch.sub(s * q.float(), m, out=out.view(-1, 8, 32))


def dequantize_q6_k(b: torch.Tensor, out: torch.Tensor) -> None:
    q, s = q6_k_affine(b)
    torch.mul(s, q.float(), out=out.view(-1, 16, 16))


# ---------------------------------------------------------------- writing blocks (the inverse)

def _pack_scale_min(sc: torch.Tensor, mn: torch.Tensor) -> torch.Tensor:
    """Eight 6-bit scales and mins (nb, 8) -> the 12-byte layout _scale_min reads."""
    out = torch.empty(sc.shape[0], 12, dtype=torch.uint8)
    out[:, 0:4] = (sc[:, 0:4] & 0x3F) | ((sc[:, 4:8] >> 4) << 6)
    out[:, 4:8] = (mn[:, 0:4] & 0x3F) | ((mn[:, 4:8] >> 4) << 6)
    out[:, 8:12] = (sc[:, 4:8] & 0x0F) | ((mn[:, 4:8] & 0x0F) << 4)
    return out


def _nibbles_to_bytes(q: torch.Tensor) -> torch.Tensor:
    """(nb, 8, 32) codes < 16 -> (nb, 128) bytes, the inverse of _low_high_nibbles."""
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


# ---------------------------------------------------------------- every type: dequantize()

def half(b: torch.Tensor, lo: int) -> torch.Tensor:
    return b[:, lo:lo + 2].contiguous().view(torch.float16).float()


def _dq_q8_0(b: torch.Tensor, out: torch.Tensor) -> None:
    torch.mul(b[:, 2:].contiguous().view(torch.int8), half(b, 0), out=out)


def _dq_q4_0(b: torch.Tensor, out: torch.Tensor) -> None:
    d, qs = half(b, 0), b[:, 2:]
    out = out.view(-1, 2, 16)
    out[:, 0] = qs & 0xF
    out[:, 1] = qs >> 4
    out.sub_(8).mul_(d[:, :, None])


def _dq_q4_1(b: torch.Tensor, out: torch.Tensor) -> None:
    d, m, qs = half(b, 0), half(b, 2), b[:, 4:]
    out = out.view(-1, 2, 16)
    torch.addcmul(m, qs & 0xF, d, out=out[:, 0])
    torch.addcmul(m, qs >> 4, d, out=out[:, 1])


_FAST = {
    GGMLQuantizationType.Q8_0: _dq_q8_0, GGMLQuantizationType.Q4_0: _dq_q4_0, GGMLQuantizationType.Q4_1: _dq_q4_1,
    GGMLQuantizationType.Q4_K: dequantize_q4_k, GGMLQuantizationType.Q5_K: dequantize_q5_k,
    GGMLQuantizationType.Q6_K: dequantize_q6_k,
}
_PLAIN = {GGMLQuantizationType.F32: torch.float32, GGMLQuantizationType.F16: torch.float16,
          GGMLQuantizationType.BF16: torch.bfloat16}
_CHUNK_BLOCKS = 1 << 16  # keeps each step's temporaries in cache


@functools.lru_cache(maxsize=None)
def dequantizable(qtype: GGMLQuantizationType) -> bool:
    """Whether dequantize() can read this ggml type (our fast paths, else gguf's numpy decoders)."""
    if qtype in _PLAIN or qtype in _FAST:
        return True
    try:
        gguf_dequantize(np.zeros(GGML_QUANT_SIZES[qtype][1], dtype=np.uint8), qtype)
        return True
    except (NotImplementedError, KeyError):
        return False


def dequantize(raw: torch.Tensor, qtype: GGMLQuantizationType, shape: tuple[int, ...],
               dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Dequantize ggml-format bytes (any leading shape, uint8) into a new tensor of `shape` and `dtype`."""
    if qtype in _PLAIN:
        return raw.reshape(-1).view(_PLAIN[qtype]).reshape(shape).to(dtype, copy=True)
    if qtype in _FAST:
        block, block_bytes = GGML_QUANT_SIZES[qtype]
        blocks = raw.reshape(-1, block_bytes)
        out = torch.empty(blocks.shape[0], block, dtype=torch.float32, device=raw.device)
        for i in range(0, blocks.shape[0], _CHUNK_BLOCKS):
            _FAST[qtype](blocks[i:i + _CHUNK_BLOCKS], out[i:i + _CHUNK_BLOCKS])
        return out.view(shape).to(dtype)
    values = gguf_dequantize(raw.cpu().numpy(), qtype)  # k-quants, i-quants...: gguf's numpy reference
    return torch.from_numpy(np.ascontiguousarray(values)).reshape(shape).to(device=raw.device, dtype=dtype)
