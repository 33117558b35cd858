"""Quantized K/V page formats ("q8", "q6", "q4"): the same page geometry as an fp16 pool, fewer bytes.

Each token's head vector is split into groups of `group_size` along head_dim; each group gets one fp16
scale (symmetric, scale = max|x| / qmax) and its values are stored as unsigned offset integers:
  q8: one byte per value.
  q4: two values per byte (value 2j in the low nibble of byte j, 2j+1 in the high nibble).
  q6: the low 4 bits packed as q4, plus the high 2 bits packed four per byte (value 4j+i in bits 2i..2i+1).
Rounding is half-up (floor(x + 0.5)) in both the torch and the Triton writer.
Before quantizing, each head vector is rotated by an orthonormal matrix R (a normalized Hadamard matrix
when head_dim is a power of two, else a fixed random orthogonal one): outlier channels, common in keys,
are spread over the whole group so one large value no longer flattens the scale of its neighbours.
Attention never un-rotates the cache: (qR)(kR)^T = qk^T, so readers rotate the query and un-rotate the
output (sum_j p_j v_j R = (sum_j p_j v_j) R), O(D^2) per query token instead of per cached token.
Quantizing per token (not per page) means a write never rewrites earlier tokens, so pages stay
shareable and prefix-cacheable exactly as in the fp16 cache."""

from __future__ import annotations

import math
import mmap
from dataclasses import dataclass

import torch

FORMATS = {"q8": 8, "q6": 6, "q4": 4}
DEFAULT_GROUP = 32
LAZY_MIN_BYTES = 64 << 10  # smaller pools (tiny test models) are plain zeros


def lazy_zeros(*shape: int, dtype: torch.dtype, device: torch.device | str = "cpu") -> torch.Tensor:
    """Zeros that take memory only where written. A pool sized for the whole context (8,192 tokens of a big
    model: 0.5-1 GB) would otherwise be resident at creation, however few pages the chats use: on the CPU a
    pool of LAZY_MIN_BYTES or more lives in an anonymous map, whose pages the kernel hands out zero-filled on
    first touch (torch.zeros writes, so makes every page resident; torch.empty may reuse dirty heap)."""
    device = torch.device(device)
    numel = math.prod(shape)
    nbytes = numel * torch.empty(0, dtype=dtype).element_size()
    if device.type != "cpu" or nbytes < LAZY_MIN_BYTES:
        return torch.zeros(*shape, dtype=dtype, device=device)
    buf = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)  # private: counted as RssAnon
    return torch.frombuffer(buf, dtype=dtype, count=numel).view(*shape)  # the tensor keeps the map alive


def qmax(fmt: str) -> int:
    """Largest magnitude of the symmetric integer grid of a format (127, 31 or 7)."""
    return (1 << (FORMATS[fmt] - 1)) - 1


def _check_format(fmt: str, head_dim: int, group_size: int) -> None:
    if fmt not in FORMATS:
        raise ValueError(f"unknown KV quantization {fmt!r}; expected one of {sorted(FORMATS)}")
    if group_size < 4 or group_size % 4 or head_dim % group_size:
        raise ValueError(f"head_dim {head_dim} must be a multiple of group_size {group_size} (itself a multiple of 4)")


def rotation_matrix(head_dim: int) -> torch.Tensor:
    """Orthonormal (D, D) fp32: Sylvester Hadamard / sqrt(D) for powers of two, else seeded random QR."""
    if head_dim & (head_dim - 1) == 0:
        h = torch.ones(1, 1)
        while h.shape[0] < head_dim:
            h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
        return h / head_dim ** 0.5
    g = torch.Generator().manual_seed(head_dim)
    q, r = torch.linalg.qr(torch.randn(head_dim, head_dim, generator=g, dtype=torch.float64))
    return (q * torch.sign(torch.diagonal(r))).float()


def quantize(x: torch.Tensor, fmt: str, group_size: int = DEFAULT_GROUP):
    """(..., D) float -> (data uint8, high uint8 | None, scales fp16 (..., D/group)) in the page format."""
    D = x.shape[-1]
    _check_format(fmt, D, group_size)
    g = x.float().reshape(*x.shape[:-1], D // group_size, group_size)
    scales = (g.abs().amax(-1) / qmax(fmt)).to(torch.float16)
    s = scales.float()
    inv = torch.where(s > 0, 1.0 / s, torch.zeros_like(s))
    q = torch.floor(g * inv[..., None] + 0.5).clamp_(-qmax(fmt), qmax(fmt)).to(torch.int32)
    u = (q + qmax(fmt) + 1).reshape(*x.shape[:-1], D)  # offset binary, 1..2*qmax+1
    if fmt == "q8":
        return u.to(torch.uint8), None, scales
    low = u & 0xF
    data = (low[..., 0::2] | (low[..., 1::2] << 4)).to(torch.uint8)
    if fmt == "q4":
        return data, None, scales
    hi = u >> 4
    high = (hi[..., 0::4] | (hi[..., 1::4] << 2) | (hi[..., 2::4] << 4) | (hi[..., 3::4] << 6)).to(torch.uint8)
    return data, high, scales


def dequantize(
    data: torch.Tensor, high: torch.Tensor | None, scales: torch.Tensor, fmt: str, group_size: int, dtype: torch.dtype
) -> torch.Tensor:
    """Inverse of quantize: back to (..., D) in `dtype`."""
    d = data.to(torch.int32)
    if fmt == "q8":
        u = d
    else:
        u = torch.stack([d & 0xF, d >> 4], dim=-1).flatten(-2)
        if fmt == "q6":
            h = high.to(torch.int32)
            hi = torch.stack([(h >> s) & 0x3 for s in (0, 2, 4, 6)], dim=-1).flatten(-2)
            u = u | (hi << 4)
    D = u.shape[-1]
    q = (u - (qmax(fmt) + 1)).to(torch.float32).reshape(*u.shape[:-1], D // group_size, group_size)
    return (q * scales.float()[..., None]).reshape(*u.shape[:-1], D).to(dtype)


@dataclass
class QuantizedPool:
    """One layer's K (or V) pool in a quantized format; drop-in for a (num_pages, page_size, H, D) tensor
    wherever kernels.write_kv / kernels.paged_attention take a cache."""

    fmt: str
    data: torch.Tensor  # uint8 (num_pages, page_size, H, D or D/2)
    high: torch.Tensor | None  # uint8 (num_pages, page_size, H, D/4), q6 only
    scales: torch.Tensor  # fp16 (num_pages, page_size, H, D/group_size)
    group_size: int
    head_dim: int
    rotation: torch.Tensor | None = None  # (D, D) fp32 orthonormal; None stores vectors unrotated

    @classmethod
    def empty(
        cls, fmt: str, num_pages: int, page_size: int, num_heads: int, head_dim: int,
        device: torch.device | str = "cpu", group_size: int = DEFAULT_GROUP, rotate: bool = True,
    ) -> "QuantizedPool":
        """A zeroed pool (all values decode to 0.0)."""
        _check_format(fmt, head_dim, group_size)
        lead = (num_pages, page_size, num_heads)
        data_cols, high_cols, scale_cols = _columns(fmt, head_dim, group_size)
        data = lazy_zeros(*lead, data_cols, dtype=torch.uint8, device=device)
        high = lazy_zeros(*lead, high_cols, dtype=torch.uint8, device=device) if high_cols else None
        scales = lazy_zeros(*lead, scale_cols, dtype=torch.float16, device=device)
        rot = rotation_matrix(head_dim).to(device) if rotate else None
        return cls(fmt, data, high, scales, group_size, head_dim, rot)

    @property
    def shape(self) -> torch.Size:
        return torch.Size((*self.data.shape[:3], self.head_dim))

    @property
    def device(self) -> torch.device:
        return self.data.device

    @property
    def page_size(self) -> int:
        return self.data.shape[1]

    @property
    def num_pages(self) -> int:
        return self.data.shape[0]

    def tensors(self) -> list[torch.Tensor]:
        return [t for t in (self.data, self.high, self.scales) if t is not None]

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors())

    def rotate(self, x: torch.Tensor) -> torch.Tensor:
        """x R in fp32 (queries and K/V on the way in); identity when the pool is unrotated."""
        return x.float() if self.rotation is None else x.float() @ self.rotation

    def unrotate(self, y: torch.Tensor) -> torch.Tensor:
        """y R^T in fp32 (attention output on the way out)."""
        return y.float() if self.rotation is None else y.float() @ self.rotation.T

    def write(self, x: torch.Tensor, slot_mapping: torch.Tensor) -> None:
        """Torch path of quantize-on-write: x (T, H, D) into flat slots."""
        data, high, scales = quantize(self.rotate(x), self.fmt, self.group_size)
        idx = slot_mapping.to(torch.int64)
        for dst, src in ((self.data, data), (self.high, high), (self.scales, scales)):
            if dst is not None:
                dst.view(-1, *dst.shape[2:]).index_copy_(0, idx, src)

    def gather_rotated(self, pages: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """Dequantized pages as stored (rotated): index tensor of any shape -> (*pages.shape, page_size, H, D)."""
        high = self.high[pages] if self.high is not None else None
        return dequantize(self.data[pages], high, self.scales[pages], self.fmt, self.group_size, dtype)

    def gather(self, pages: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """Dequantized pages in the original basis (what was written, up to quantization error)."""
        return self.unrotate(self.gather_rotated(pages, torch.float32)).to(dtype)

    def copy_pages(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Copy whole pages."""
        for t in self.tensors():
            t[dst] = t[src]

    def copy_prefix(self, src: int, dst: int, n: int) -> None:
        """Copy the first n slots of page src into page dst (partial-page prefix reuse)."""
        for t in self.tensors():
            t[dst, :n] = t[src, :n]

    def permute(self, idx: torch.Tensor) -> None:
        """Page k takes what page idx[k] held (defragmentation)."""
        for t in self.tensors():
            t.copy_(t.index_select(0, idx))


def make_pool(
    kv_quant: str | None, num_pages: int, page_size: int, num_heads: int, head_dim: int,
    dtype: torch.dtype, device: torch.device | str = "cpu", rotate: bool = True,
):
    """What PagedCache allocates per layer and per K/V: a plain tensor (kv_quant None) or a QuantizedPool."""
    if kv_quant is None:
        return lazy_zeros(num_pages, page_size, num_heads, head_dim, dtype=dtype, device=device)
    return QuantizedPool.empty(kv_quant, num_pages, page_size, num_heads, head_dim, device=device, rotate=rotate)


def copy_pages(cache, src: torch.Tensor, dst: torch.Tensor) -> None:
    """Whole-page copy for either pool kind."""
    if isinstance(cache, QuantizedPool):
        cache.copy_pages(src, dst)
    else:
        cache[dst] = cache[src]


def copy_page_prefix(cache, src: int, dst: int, n: int) -> None:
    """First n slots of page src into page dst, for either pool kind."""
    if isinstance(cache, QuantizedPool):
        cache.copy_prefix(src, dst, n)
    else:
        cache[dst, :n] = cache[src, :n]


def permute_pages(cache, idx: torch.Tensor) -> None:
    """Page k takes what page idx[k] held, for either pool kind."""
    if isinstance(cache, QuantizedPool):
        cache.permute(idx)
    else:
        cache.copy_(cache.index_select(0, idx))


def _columns(fmt: str, head_dim: int, group_size: int) -> tuple[int, int, int]:
    """(code bytes, high-bit bytes, fp16 scales) per head and slot of a quantized format."""
    return (head_dim if fmt == "q8" else head_dim // 2), (head_dim // 4 if fmt == "q6" else 0), head_dim // group_size


def slot_nbytes(fmt: str | None, num_heads: int, head_dim: int, element_bytes: int, group_size: int = DEFAULT_GROUP) -> int:
    """Bytes one token's K (or V) takes in a pool of this format, all heads: for sizing before allocating."""
    if fmt is None:
        return num_heads * head_dim * element_bytes
    data, high, scales = _columns(fmt, head_dim, group_size)
    return num_heads * (data + high + 2 * scales)


def pool_nbytes(cache) -> int:
    """Bytes held by a pool of either kind."""
    if isinstance(cache, QuantizedPool):
        return cache.nbytes
    return cache.numel() * cache.element_size()
