"""ggml's K-quant blocks (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K) in vectorized torch: exact decoding and the affine per-group
form the packed matmuls use (tools.ggml_writers writes such blocks, for test and benchmark GGUFs); below them the
exact decoders of every type the loader reads fast (Q8_0, Q4_0, Q4_1, and the 4-bit lookup-table types MXFP4,
IQ4_NL, IQ4_XS: codes into a 16-entry table times one scale a 32 weights).

Super-blocks hold 256 weights. Q4_K/Q5_K: fp16 d and dmin, twelve bytes packing eight 6-bit scales and
mins (one per 32 weights), then 4-bit codes (plus one high bit per weight for Q5_K): w = d*sc*q - dmin*m.
Q6_K: 4 low bits, 2 high bits, sixteen int8 scales (one per 16 weights), fp16 d: w = d*sc*(q - 32).
Q3_K: a third bit a weight (hmask), 2 low bits, sixteen 6-bit scales less 32, fp16 d: w = d*sc*(q - 4), the
offset taken where the third bit is clear. Q2_K: a 4-bit scale and minimum per 16 weights, 2-bit codes, fp16 d
and dmin: w = d*sc*q - dmin*m.
The decoders follow gguf's numpy reference operation for operation, so results are bit-identical.
"""

from __future__ import annotations

import functools

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import dequantize as gguf_dequantize

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


def q3_k_affine(b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q3_K blocks (nb, 110) -> signed codes (nb, 16, 16) int8 in -4..3 and scales (nb, 16, 1): w = s*q."""
    hmask, qs, sc = b[:, 0:32], b[:, 32:96], b[:, 96:108]
    d = _f16(b[:, 108:110])
    low = (sc[:, 0:8].reshape(-1, 1, 8) >> torch.tensor([0, 4], dtype=torch.uint8, device=b.device).view(1, 2, 1))
    high = sc[:, 8:12].reshape(-1, 1, 4) >> torch.tensor([0, 2, 4, 6], dtype=torch.uint8, device=b.device).view(1, 4, 1)
    scales = ((low.reshape(-1, 16) & 0x0F) | ((high.reshape(-1, 16) & 0x03) << 4)).to(torch.int8) - 32
    shifts = torch.tensor([0, 2, 4, 6], dtype=torch.uint8, device=b.device).view(1, 1, 4, 1)
    ql = (qs.reshape(-1, 2, 1, 32) >> shifts) & 0x03  # (nb, 2, 4, 32): weight 128 n + 32 j + l
    bits = torch.arange(8, dtype=torch.uint8, device=b.device).view(1, 8, 1)
    qh = ((hmask.reshape(-1, 1, 32) >> bits) & 1) ^ 1  # (nb, 8, 32): 1 where the offset applies
    q = (ql.reshape(-1, 8, 32).to(torch.int8) - (qh << 2).to(torch.int8)).reshape(-1, 16, 16)
    return q, (d * scales.float()).reshape(-1, 16, 1)


def dequantize_q2_k(b: torch.Tensor, out: torch.Tensor) -> None:
    """Q2_K blocks (nb, 84): (d * sc) * q - dmin * m per 16 weights, in gguf's operation order."""
    sc, qs = b[:, 0:16], b[:, 16:80]
    d, dmin = _f16(b[:, 80:82]), _f16(b[:, 82:84])
    shifts = torch.tensor([0, 2, 4, 6], dtype=torch.uint8, device=b.device).view(1, 1, 4, 1)
    q = ((qs.reshape(-1, 2, 1, 32) >> shifts) & 0x03).reshape(-1, 16, 16).float()
    dl, ml = (d * (sc & 0x0F).float())[..., None], (dmin * (sc >> 4).float())[..., None]
    torch.sub(dl * q, ml, out=out.view(-1, 16, 16))


def dequantize_q3_k(b: torch.Tensor, out: torch.Tensor) -> None:
    q, s = q3_k_affine(b)
    torch.mul(s, q.float(), out=out.view(-1, 16, 16))


def dequantize_q4_k(b: torch.Tensor, out: torch.Tensor) -> None:
    q, s, m = q4_k_affine(b)
    torch.sub(s * q.float(), m, out=out.view(-1, 8, 32))


def dequantize_q5_k(b: torch.Tensor, out: torch.Tensor) -> None:
    q, s, m = q5_k_affine(b)
    torch.sub(s * q.float(), m, out=out.view(-1, 8, 32))


def dequantize_q6_k(b: torch.Tensor, out: torch.Tensor) -> None:
    q, s = q6_k_affine(b)
    torch.mul(s, q.float(), out=out.view(-1, 16, 16))


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


# The 4-bit lookup-table types (kernels/cpu/lut4.h): MXFP4's E2M1 values doubled, IQ4_NL's (and IQ4_XS's) table
KVALUES_MXFP4 = (0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12)
KVALUES_IQ4NL = (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113)


def _lut_nibbles(qs: torch.Tensor, table: tuple[int, ...]) -> torch.Tensor:
    """(nb, 16 g) bytes -> (nb, g, 32) fp32 table values: per 16 bytes the low nibbles are weights 0..15, the high
    ones 16..31."""
    q = qs.reshape(qs.shape[0], -1, 1, 16)
    codes = torch.cat([q & 0x0F, q >> 4], dim=2).reshape(qs.shape[0], -1, 32).long()
    return torch.tensor(table, dtype=torch.float32, device=qs.device)[codes]


def e8m0_half(e: torch.Tensor) -> torch.Tensor:
    """2^(e - 128) in fp32, exactly (ggml's e8m0_to_fp32_half: MXFP4's scale with its doubled values)."""
    e = e.to(torch.int32)
    bits = torch.where(e < 2, torch.tensor(0x00200000, dtype=torch.int32) << e, (e - 1) << 23)
    return bits.view(torch.float32)


def _dq_mxfp4(b: torch.Tensor, out: torch.Tensor) -> None:
    torch.mul(_lut_nibbles(b[:, 1:], KVALUES_MXFP4)[:, 0], e8m0_half(b[:, :1]), out=out)


def _dq_iq4_nl(b: torch.Tensor, out: torch.Tensor) -> None:
    torch.mul(_lut_nibbles(b[:, 2:], KVALUES_IQ4NL)[:, 0], half(b, 0), out=out)


def iq4_xs_scales(b: torch.Tensor) -> torch.Tensor:
    """IQ4_XS super-blocks (nb, 136) -> their eight per-32 scales d * (ls - 32), fp32 (nb, 8), exact."""
    high = b[:, 2:4].contiguous().view(torch.int16).to(torch.int32)  # 16 bits: 2 a scale
    low = b[:, 4:8].to(torch.int32)
    shifts = torch.arange(8, device=b.device)
    ls = ((low[:, shifts // 2] >> (4 * (shifts % 2))) & 0x0F) | (((high >> (2 * shifts)) & 3) << 4)
    return half(b, 0) * (ls - 32).float()


def _dq_iq4_xs(b: torch.Tensor, out: torch.Tensor) -> None:
    torch.mul(_lut_nibbles(b[:, 8:], KVALUES_IQ4NL), iq4_xs_scales(b)[..., None], out=out.view(-1, 8, 32))


_FAST = {
    GGMLQuantizationType.MXFP4: _dq_mxfp4, GGMLQuantizationType.IQ4_NL: _dq_iq4_nl,
    GGMLQuantizationType.IQ4_XS: _dq_iq4_xs,
    GGMLQuantizationType.Q8_0: _dq_q8_0, GGMLQuantizationType.Q4_0: _dq_q4_0, GGMLQuantizationType.Q4_1: _dq_q4_1,
    GGMLQuantizationType.Q4_K: dequantize_q4_k, GGMLQuantizationType.Q5_K: dequantize_q5_k,
    GGMLQuantizationType.Q6_K: dequantize_q6_k, GGMLQuantizationType.Q3_K: dequantize_q3_k,
    GGMLQuantizationType.Q2_K: dequantize_q2_k,
}
_PLAIN = {GGMLQuantizationType.F32: torch.float32, GGMLQuantizationType.F16: torch.float16,
          GGMLQuantizationType.BF16: torch.bfloat16, GGMLQuantizationType.F64: torch.float64}
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
