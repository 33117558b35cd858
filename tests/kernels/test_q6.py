"""The q6 format (GGUF Q6_K super-blocks kept as the file stores them, kernels/cpu/q6.h) against the float64
statement of its integer arithmetic on its exact weights, row by row whatever the row count or thread split,
on both builds (VNNI and AVX2), and against what it replaced (Q6_K re-quantized to q8) where parts must fuse."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from gguf import GGMLQuantizationType as Q

from engine.model.packing import repack
from engine.model.ggml_blocks import dequantize, q6_k_affine
from engine.model.qlinear import Q4Linear, Q6Linear, Q8Linear, cat_packed
from kernels import cpu_ext
from tests.kernels.test_cpu_kernels import _has_vnni, assert_rows_independent, run_on_isa_build, random_q4
from tests.kernels.q8k_oracle import fma32, q8_k
from tests.kernels.test_qgemm import _call
from tools.ggml_writers import quantize_q6_k

pytestmark = pytest.mark.skipif(not cpu_ext.available(), reason="pagedeck's CPU kernels did not build here")


def random_q6(N: int, K: int, seed: int = 0, source: str = "writer") -> Q6Linear:
    """From gguf's own Q6_K writer, or random block bytes (every code, scale sign and magnitude) with finite d."""
    g = torch.Generator().manual_seed(seed)
    if source == "writer":
        return Q6Linear(quantize_q6_k(torch.randn(N, K, generator=g) * 0.05).reshape(N, -1).clone())
    raw = torch.randint(0, 256, (N * K // 256, 210), generator=g, dtype=torch.uint8)
    raw[:, 208:210] = (torch.rand(raw.shape[0], generator=g) * 1e-3).half().view(torch.uint8).view(-1, 2)
    return Q6Linear(raw.reshape(N, -1))


def reference_q6(x: torch.Tensor, w: Q6Linear) -> torch.Tensor:
    """llama.cpp's Q6_K x Q8_K arithmetic in NumPy, to the bit: per super-block the exact integer
    I = sum_i sc_(i / 16) (q_i - 32) x_i (x the Q8_K activations), then acc = fma(I, d d_x, acc) in float32,
    super-block after super-block."""
    q, dx, _ = q8_k(x)
    M, (N, K) = x.shape[0], w.shape
    blocks = w.row_blocks().reshape(-1, 210)
    sc = blocks[:, 192:208].contiguous().view(torch.int8).numpy().astype(np.int64).reshape(N, K // 256, 16)
    d = blocks[:, 208:210].contiguous().view(torch.float16).numpy().astype(np.float32).reshape(N, K // 256)
    codes, _ = q6_k_affine(blocks)  # q - 32, (super-blocks, 16, 16)
    signed = codes.numpy().astype(np.int64).reshape(N, K // 256, 16, 16) * sc[..., None]
    I = np.einsum("mshi,nshi->mns", q.reshape(M, K // 256, 16, 16), signed).astype(np.float32)
    acc = np.zeros((M, N), np.float32)
    for s in range(K // 256):
        acc = fma32(I[..., s], (d[None, :, s] * dx[:, None, s]).astype(np.float32), acc)
    return torch.from_numpy(acc)


@pytest.mark.parametrize("source", ["writer", "random bytes"])
@pytest.mark.parametrize("N,K,M", [(37, 768, 9), (8, 256, 1), (64, 4096, 5), (5, 512, 16)])
def test_q6_matmul_computes_its_stated_arithmetic(source, N, K, M):
    w = random_q6(N, K, N + K, source)
    x = torch.randn(M, K, generator=torch.Generator().manual_seed(M)) * 3
    x[0, 5] = 40.0  # an outlier channel
    if M > 4:
        x[4] = 0.0  # an all-zero row
    y = w(x)
    assert torch.equal(y, reference_q6(x, w))
    dense = F.linear(x, w.dequantize())  # per-256 activation scales: the outlier costs its super-block's codes
    assert ((y - dense).norm() / dense.norm()).item() < 5e-2


def test_q6_keeps_the_files_exact_weights_and_size():
    w = random_q6(24, 512, 1)
    exact = dequantize(w.row_blocks(), Q.Q6_K, (24, 512))
    assert torch.equal(w.dequantize(), exact)
    ids = torch.tensor([3, 23, 3])
    assert torch.equal(w.embedding(ids), exact[ids])
    assert w.nbytes() == 24 * 512 // 256 * 210 == repack.packed_nbytes("q6", (24, 512))
    assert w.nbytes() * 8 / w.numel() == 6.5625


def test_extreme_codes_scales_and_activations_sum_exactly():
    """Codes 0 and 63 with scales -128 and 127 against full-scale activations: the int16 pair sums of maddubs
    and the int32 products with the scales must not overflow."""
    N, K = 6, 512
    raw = torch.zeros(N * K // 256, 210, dtype=torch.uint8)
    raw[0::2, :192] = 0xFF  # every code 63
    raw[:, 192:208] = torch.tensor([127, 128], dtype=torch.uint8).repeat(8)  # scales 127, -128 alternating
    raw[:, 208:210] = torch.tensor([1e-3], dtype=torch.float16).view(torch.uint8)
    w = Q6Linear(raw.reshape(N, -1))
    signs = torch.randn(2, K, generator=torch.Generator().manual_seed(0)).sign()
    x = torch.cat([torch.full((1, K), 2.0), torch.full((1, K), -2.0), signs * 3])
    # float32 accumulation errs ~1e-8 of sum |w x| (rows of mixed signs cancel, so a bound relative to the
    # result fails on ~6 % of sign draws); an overflowed int16 pair sum or int32 product errs by a large part of it
    scale = x.double().abs() @ w.dequantize().double().abs().T
    assert ((w(x).double() - reference_q6(x, w).double()).abs() <= 1e-6 * scale).all()


def test_a_rows_result_never_depends_on_the_other_rows():
    """Tiles of 4 activation rows, single rows, the GEMM path (from 8 rows) and thread splits give the same bits:
    batch invariance."""
    w = random_q6(70, 1024, 2)
    x = torch.randn(41, 1024)
    assert_rows_independent(w, x, (0, 5, 13, 40), (2, 9))


@pytest.mark.parametrize("N,K,M", [(40, 1024, 23), (5, 256, 16), (33, 768, 9)])  # a last panel of 8, 5, 1 columns
def test_gemm_path_gives_the_per_row_paths_bits(N, K, M):
    """Prompt rows (qgemm.h: the codes of a panel of 16 weight rows unpacked once, the halves of 16 summed
    apart) must give the per-row path's bits for every element."""
    w = random_q6(N, K, N * K, "random bytes")
    x = torch.randn(M, K, generator=torch.Generator().manual_seed(M)) * 3
    x[1, 7] = 40.0
    x[2] = 0.0
    gemm = _call(w, x, None, "1")
    assert torch.equal(gemm, _call(w, x, None, "1000000"))
    assert torch.equal(gemm, reference_q6(x, w))
    if N % 2 == 0:
        assert torch.equal(_call(w, x, "swiglu", "1"), _call(w, x, "swiglu", "1000000"))


def test_swiglu_epilogue_is_silu_of_gate_times_up():
    w = random_q6(192, 512, 3)
    x = torch.randn(9, 512)
    gate, up = w(x).chunk(2, dim=-1)
    torch.testing.assert_close(w(x, "swiglu"), F.silu(gate) * up, rtol=1e-5, atol=1e-6)
    assert torch.equal(w(x[4:5], "swiglu"), w(x, "swiglu")[4:5])


def test_fused_parts_stay_q6_or_become_the_q8_they_were():
    """All-q6 parts stack as they are; beside q4 parts a q6 part becomes q8 with exactly the bits the loader
    gave Q6_K matrices before q6 existed (kernels/cpu/repack.cpp's q6_k_to_q8)."""
    a, b = random_q6(16, 512, 4), random_q6(8, 512, 5)
    both = cat_packed([a, b])
    assert isinstance(both, Q6Linear) and torch.equal(both.row_blocks(), torch.cat([a.row_blocks(), b.row_blocks()]))
    q4 = random_q4(16, 512, 6)
    mixed = cat_packed([q4, b])
    assert isinstance(mixed, Q8Linear)
    old = repack.from_blocks(b.row_blocks(), Q.Q6_K, (8, 512), "q8", keep_dense=False)
    assert torch.equal(mixed.qs[16:], old.qs) and torch.equal(mixed.scale[16:], old.scale)
    assert torch.equal(mixed.dense_rows(0, 16), Q8Linear.requantize(q4).dequantize())
    assert isinstance(q4, Q4Linear)


def test_loader_keeps_q6_k_as_q6():
    w = random_q6(12, 768, 7)
    seen = []
    got = repack.from_blocks(w.row_blocks(), Q.Q6_K, (12, 768), "packed", keep_dense=False,
                             done=lambda r0, r1: seen.append(r1))
    assert isinstance(got, Q6Linear) and torch.equal(got.row_blocks(), w.row_blocks()) and got.qs.data_ptr() != w.qs.data_ptr()
    assert seen[-1] == 12
    assert repack.kernel_format("Q6_K", "packed") == "q6" and repack.kernel_format("Q6_K", "q8") == "q8"
    formats = repack.kernel_formats({"blk.0.attn_q.weight": "Q4_K", "blk.0.attn_k.weight": "Q4_K",
                                     "blk.0.attn_v.weight": "Q6_K", "blk.0.ffn_down.weight": "Q6_K"}, "packed")
    assert formats == {"blk.0.attn_q.weight": "q8", "blk.0.attn_k.weight": "q8", "blk.0.attn_v.weight": "q8",
                       "blk.0.ffn_down.weight": "q6"}


@pytest.mark.skipif(not _has_vnni(), reason="no VNNI here: the default build is the AVX2 path, tested above")
def test_the_avx2_build_gives_the_same_bits():
    """The AVX2-only build (PAGEDECK_CPU_ISA=avx2) runs this file too, and its results equal this build's."""
    w = random_q6(40, 1024, 8)
    x = torch.randn(6, 1024, generator=torch.Generator().manual_seed(1))
    check = "from engine.model.qlinear import Q6Linear; assert torch.equal(Q6Linear(d['qs'])(d['x']), d['y'])"
    run_on_isa_build({"qs": w.row_blocks(), "x": x, "y": w(x)}, check, [__file__], "not avx2_build")
