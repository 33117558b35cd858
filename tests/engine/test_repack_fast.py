"""The C++ repackers (kernels/cpu/repack.cpp via engine.model.packing.repack_fast) against the torch route they replace:
every packed byte, scale and minimum must be the same bits, for K-quant blocks from the writers, for random
block bytes (every scale/min/code pattern), and q8_quantize against its torch rule on rounding ties."""
from __future__ import annotations

import os

import pytest
import torch
from gguf import GGMLQuantizationType as Q

from engine import envs
from engine.model.packing import repack_fast
from engine.model.qlinear import Q4Linear
from engine.model.packing.repack import from_blocks, q4_parts
from kernels import cpu_ext
from kernels.packed import q8_quantize
from tools.ggml_writers import quantize_q4_k, quantize_q6_k

pytestmark = pytest.mark.skipif(not cpu_ext.available(), reason="pagedeck's CPU kernels did not build here")


def _torch_route(fn):
    os.environ["PAGEDECK_CPU_KERNELS"] = "0"
    envs.refresh("PAGEDECK_CPU_KERNELS")
    try:
        assert cpu_ext.ops() is None
        return fn()
    finally:
        os.environ.pop("PAGEDECK_CPU_KERNELS")
        envs.refresh("PAGEDECK_CPU_KERNELS")


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.uint8)


def _same_bits(fast, slow) -> None:
    """The same class, every packed tensor bit for bit, the same decoded weights."""
    assert type(fast) is type(slow)
    for a, b in zip(fast.blocks, slow.blocks):
        assert (a is None) == (b is None)
        if a is not None:
            assert torch.equal(_bits(a), _bits(b))
    assert torch.equal(fast.dequantize(), slow.dequantize())


def _random_blocks(n: int, k: int, size: int, half_at: tuple[int, ...], seed: int) -> torch.Tensor:
    """Random block bytes with finite fp16 fields at the given offsets."""
    g = torch.Generator().manual_seed(seed)
    raw = torch.randint(0, 256, (n * k // 256, size), generator=g, dtype=torch.uint8)
    for at in half_at:
        raw[:, at:at + 2] = (torch.rand(raw.shape[0], generator=g) * 0.02).half().view(torch.uint8).view(-1, 2)
    return raw.reshape(n, -1)


@pytest.mark.parametrize("qtype,kernel", [(Q.Q4_K, "q4"), (Q.Q6_K, "q8")])
@pytest.mark.parametrize("source", ["writer", "random bytes"])
def test_repackers_give_the_torch_routes_bits(qtype, kernel, source):
    n, k = 40, 768
    if source == "writer":
        w = torch.randn(n, k) * 0.05
        w[3, :32] = 0.0  # an all-zero block
        rows = (quantize_q4_k if qtype == Q.Q4_K else quantize_q6_k)(w)
    else:
        rows = _random_blocks(n, k, 144 if qtype == Q.Q4_K else 210, (0, 2) if qtype == Q.Q4_K else (208,), 7)
    fast = repack_fast.pack(rows, qtype, (n, k), kernel)
    assert fast is not None
    if qtype == Q.Q4_K:  # weights="packed" keeps Q4_K as q4k: q4 of Q4_K is the mixed groups' way to q8
        codes, scale, minimum = q4_parts(rows, qtype, k)
        slow = Q4Linear(codes, scale, minimum, keep_dense=False)
    else:  # weights="packed" keeps Q6_K as q6 (no repacking)
        slow = _torch_route(lambda: from_blocks(rows, qtype, (n, k), "q8", keep_dense=False))
    _same_bits(fast, slow)


def test_types_without_a_repacker_take_the_torch_route():
    assert repack_fast.pack(torch.zeros(4, 34 * 8, dtype=torch.uint8), Q.Q8_0, (4, 256), "q8") is None
    assert repack_fast.pack(torch.zeros(4, 144, dtype=torch.uint8), Q.Q4_K, (4, 256), "q8") is None


def test_q8_quantize_keeps_gguf_rounding():
    """Half-way codes round away from zero, zero blocks get scale 0, and the C++ rule equals the torch one."""
    w = torch.randn(64, 256) * 0.1
    w[0, :32] = 0.0
    w[1, :32] = torch.linspace(-1, 1, 32)  # steps of 2/31: many near-ties at 127/max
    w[2, :32] = torch.arange(32) - 16.0  # max 16: code = round(x * 127/16), x * 7.9375 hits .5 ties
    codes, scale = q8_quantize(w)
    ref_codes, ref_scale = _torch_route(lambda: q8_quantize(w))
    assert torch.equal(codes, ref_codes) and torch.equal(_bits(scale), _bits(ref_scale))
    assert scale[0, 0].item() == 0.0 and codes[0, :32].abs().max().item() == 0


def test_q4_to_q8_requantize_gives_the_torch_routes_bits():
    """A Q4_K_M file's q|k (Q4_K) fused with its v (Q6_K) become q8 of their exact weights."""
    from engine.model.qlinear import Q8Linear

    rows = _random_blocks(24, 512, 144, (0, 2), 3)
    q4 = repack_fast.pack(rows, Q.Q4_K, (24, 512), "q4")
    fast = Q8Linear.requantize(q4)
    slow = _torch_route(lambda: Q8Linear.requantize(q4))
    assert torch.equal(fast.qs, slow.qs) and torch.equal(_bits(fast.scale), _bits(slow.scale))


@pytest.mark.parametrize("qtype", [Q.Q8_0, Q.Q5_0, Q.Q5_1, Q.Q4_0, Q.Q4_1])
@pytest.mark.parametrize("k", [96, 640])  # an odd number of 32-weight blocks a row (q5 pairs them), and even
def test_per_32_blocks_load_through_cpp_with_the_torch_routes_bits(qtype, k, monkeypatch):
    """Q8_0 -> q8, Q5_0/Q5_1 -> q5 and Q4_0/Q4_1 -> q4 (repack_fast.tile_into, a tile of rows a call) equal the
    torch route bit for bit: random block bytes (every code and fifth-bit pattern, Q5_0's -16d and Q4_0's -8d
    minimums) over several tiles."""
    from gguf import GGML_QUANT_SIZES

    from engine.model.qlinear import packed_linear

    size = GGML_QUANT_SIZES[qtype][1]
    n = 300
    g = torch.Generator().manual_seed(3)
    raw = torch.randint(0, 256, (n * k // 32, size), generator=g, dtype=torch.uint8)
    for at in (0, 2) if qtype in (Q.Q5_1, Q.Q4_1) else (0,):
        raw[:, at:at + 2] = ((torch.rand(raw.shape[0], generator=g) - 0.5) * 0.04).half().view(torch.uint8).view(-1, 2)
    rows = raw.reshape(n, -1)
    tiles = []
    monkeypatch.setattr(packed_linear, "TILE_WEIGHTS", 64 * k)  # several tiles, the last one short
    fast = from_blocks(rows, qtype, (n, k), "packed", keep_dense=False, done=lambda a, b: tiles.append((a, b)))
    slow = _torch_route(lambda: from_blocks(rows, qtype, (n, k), "packed", keep_dense=False))
    assert tiles == [(r, min(r + 64, n)) for r in range(0, n, 64)]
    _same_bits(fast, slow)
