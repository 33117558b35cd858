"""The q4k format (GGUF Q4_K super-blocks kept as the file stores them, kernels/cpu/q4k.h): its weights are
gguf's own decode of the bytes; its products are a NumPy statement of llama.cpp's Q4_K x Q8_K integer
arithmetic to the bit, per-row and GEMM paths bit for bit, on both builds (VNNI and AVX2); it stays near the q4 repack it replaced;
the loader keeps Q4_K as q4k, fuses all-Q4_K groups by copying rows, and mixed groups keep their old q8 bits;
and a Q4_K file's logits stay within the fidelity bounds against llama.cpp."""
from __future__ import annotations

import os

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize as gguf_dequantize

from engine.model.packing import repack
from engine.model.packing import repack_fast
from engine.model.qlinear import PartsLinear, Q4KLinear, Q4Linear, Q8Linear, cat_packed
from kernels import cpu_ext
from tests.kernels.q8k_oracle import fma32, q8_k
from tests.kernels.test_cpu_kernels import _has_vnni, assert_rows_independent, run_on_isa_build
from tests.kernels.test_q6 import random_q6
from tests.kernels.test_qgemm import _call
from tools.ggml_writers import quantize_q4_k

pytestmark = pytest.mark.skipif(not cpu_ext.available(), reason="pagedeck's CPU kernels did not build here")


def random_q4k(N: int, K: int, seed: int = 0, source: str = "writer") -> Q4KLinear:
    """From the Q4_K writer, or random block bytes (every code, 6-bit scale and minimum) with small finite d."""
    g = torch.Generator().manual_seed(seed)
    if source == "writer":
        return Q4KLinear(quantize_q4_k(torch.randn(N, K, generator=g) * 0.05).reshape(N, -1).clone())
    raw = torch.randint(0, 256, (N * K // 256, 144), generator=g, dtype=torch.uint8)
    raw[:, 0:4] = (torch.rand(raw.shape[0], 2, generator=g) * 1e-3).half().view(torch.uint8).view(-1, 4)
    return Q4KLinear(raw.reshape(N, -1))


def gguf_weights(w: Q4KLinear) -> torch.Tensor:
    """gguf-py's own Q4_K decoder: the oracle of the weights."""
    return torch.from_numpy(gguf_dequantize(w.row_blocks().numpy(), Q.Q4_K).astype(np.float32)).view(w.shape)


def q4_k_fields(qs: torch.Tensor, N: int, K: int) -> tuple[np.ndarray, ...]:
    """d, dmin (N, K/256) float32; sc, m (N, K/256, 8); codes (N, K/256, 8, 32), as ggml's dequantize_row_q4_K
    reads the bytes."""
    b = qs.numpy().reshape(N, K // 256, 144)
    d = b[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)
    dmin = b[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32)
    q = b[..., 4:16].astype(np.int64)
    sc = np.concatenate([q[..., 0:4] & 63, (q[..., 8:12] & 15) | ((q[..., 0:4] >> 6) << 4)], -1)
    m = np.concatenate([q[..., 4:8] & 63, (q[..., 8:12] >> 4) | ((q[..., 4:8] >> 6) << 4)], -1)
    nib = b[..., 16:].astype(np.int64).reshape(N, K // 256, 4, 32)
    codes = np.stack([nib & 15, nib >> 4], 3).reshape(N, K // 256, 8, 32)
    return d, dmin, sc, m, codes


def reference_q4k(x: torch.Tensor, w: Q4KLinear) -> torch.Tensor:
    """llama.cpp's Q4_K x Q8_K arithmetic in NumPy, to the bit: per super-block the integers
    I = sum_b sc_b (q_b . x_b) and J = sum_b m_b bs_b, then acc = fma(I, d d_x, acc), acc = fma(-J, dmin d_x, acc)
    in float32, super-block after super-block."""
    return reference_superblocks(x, w.shape[1], *q4_k_fields(w.row_blocks(), *w.shape))


def reference_superblocks(x: torch.Tensor, K: int, d, dmin, sc, m, codes) -> torch.Tensor:
    """reference_q4k's arithmetic over decoded fields (q4_k_fields' forms; Q5_K's codes run to 31)."""
    q, dx, bs = q8_k(x)
    dots = np.einsum("msbi,nsbi->mnsb", q.reshape(*q.shape[:2], 8, 32), codes)
    I = (dots * sc[None]).sum(-1).astype(np.float32)  # (M, N, S)
    J = (bs[:, None] * m[None]).sum(-1).astype(np.float32)
    acc = np.zeros(I.shape[:2], np.float32)
    for s in range(K // 256):
        dd = (d[None, :, s] * dx[:, None, s]).astype(np.float32)
        dm = (dmin[None, :, s] * dx[:, None, s]).astype(np.float32)
        acc = fma32(I[..., s], dd, acc)
        acc = fma32(-J[..., s], dm, acc)
    return torch.from_numpy(acc)


def test_reference_fma_rounds_once():
    """The reference's fp32 fma is the single rounding of a * b + c: here float64's rounding alone lands on a
    float32 tie, and ties-to-even would round the wrong way for c > 0."""
    a = np.array([1 + 2 ** -12], np.float32)  # a * a = 1 + 2^-11 + 2^-24: a float32 tie
    for c, want in ((2.0 ** -60, 1 + 2 ** -11 + 2 ** -23), (-(2.0 ** -60), 1 + 2 ** -11)):
        assert fma32(a, a, np.array([c], np.float32))[0] == np.float32(want)


@pytest.mark.parametrize("source", ["writer", "random bytes"])
@pytest.mark.parametrize("N,K,M", [(37, 768, 9), (8, 256, 1), (64, 4096, 5), (5, 512, 16)])
def test_q4k_matmul_computes_its_stated_arithmetic(source, N, K, M):
    w = random_q4k(N, K, N + K, source)
    x = torch.randn(M, K, generator=torch.Generator().manual_seed(M)) * 3
    x[0, 5] = 40.0  # an outlier channel
    if M > 4:
        x[4] = 0.0  # an all-zero row
    y = w(x)
    assert torch.equal(y, reference_q4k(x, w))
    q, dx, _ = q8_k(x)  # the product of gguf's weights and the Q8_K activations, up to fp32 rounding
    xq = torch.from_numpy((q * dx[..., None].astype(np.float64)).reshape(M, K))
    exact = xq @ gguf_weights(w).double().T
    assert ((y.double() - exact).norm() / exact.norm()).item() < 1e-5
    dense = F.linear(x, gguf_weights(w))  # per-256 activation scales: the outlier costs its super-block's codes
    assert ((y - dense).norm() / dense.norm()).item() < 5e-2


def test_q4k_keeps_the_files_exact_weights_and_size():
    w = random_q4k(24, 512, 1, "random bytes")
    exact = gguf_weights(w)
    assert torch.equal(w.dequantize(), exact)
    ids = torch.tensor([3, 23, 3])
    assert torch.equal(w.embedding(ids), exact[ids])
    assert w.nbytes() == 24 * 512 // 256 * 144 == repack.packed_nbytes("q4k", (24, 512))
    assert w.nbytes() * 8 / w.numel() == 4.5
    assert repack.packed_nbytes("q4", (24, 512)) * 8 / w.numel() == 5.0


def test_extreme_codes_scales_and_activations_sum_exactly():
    """Codes 15 with scales and minimums 63 against full-scale activations: no int16 or int32 overflow."""
    N, K = 6, 512
    raw = torch.zeros(N * K // 256, 144, dtype=torch.uint8)
    raw[:, 0:4] = torch.tensor([1e-3, 5e-4]).half().view(torch.uint8)
    raw[:, 4:16] = 0xFF  # every 6-bit scale and minimum 63
    raw[:, 16:] = 0xFF  # every code 15
    raw[1::2, 16:] = 0x0F  # low nibbles 15, high 0
    w = Q4KLinear(raw.reshape(N, -1))
    x = full_scale_activations(K)
    assert torch.equal(w(x), reference_q4k(x, w))
    assert torch.equal(_call(w, x, None, "1"), reference_q4k(x, w))


def full_scale_activations(K: int) -> torch.Tensor:
    """Rows whose Q8_K codes are all +127, all -127, and alternating: the largest integer sums."""
    x = torch.full((5, K), 7.0)
    x[1] = -7.0
    x[2, ::2] = -7.0
    return x


def test_a_rows_result_never_depends_on_the_other_rows():
    w = random_q4k(70, 1024, 2, "random bytes")
    x = torch.randn(41, 1024)
    assert_rows_independent(w, x, (0, 5, 13, 40), (2, 9))


@pytest.mark.parametrize("N,K,M", [(40, 1024, 23), (5, 256, 16), (33, 768, 9)])  # a last panel of 8, 5, 1 columns
def test_gemm_path_gives_the_per_row_paths_bits(N, K, M):
    """Prompt rows (q4k.h's GEMM tile over its panels) must give the per-row path's bits for every element."""
    w = random_q4k(N, K, N * K, "random bytes")
    x = torch.randn(M, K, generator=torch.Generator().manual_seed(M)) * 3
    x[1, 7] = 40.0
    x[2] = 0.0
    gemm = _call(w, x, None, "1")
    assert torch.equal(gemm, _call(w, x, None, "1000000"))
    assert torch.equal(gemm, reference_q4k(x, w))
    if N % 2 == 0:
        assert torch.equal(_call(w, x, "swiglu", "1"), _call(w, x, "swiglu", "1000000"))


def test_swiglu_epilogue_is_silu_of_gate_times_up():
    w = random_q4k(192, 512, 3)
    x = torch.randn(9, 512)
    gate, up = w(x).chunk(2, dim=-1)
    torch.testing.assert_close(w(x, "swiglu"), F.silu(gate) * up, rtol=1e-5, atol=1e-6)
    assert torch.equal(w(x[4:5], "swiglu"), w(x, "swiglu")[4:5])


@pytest.mark.parametrize("rows_from", ["1", "1000000"])
def test_near_the_q4_repack_it_replaced_and_nearer_the_exact_weights(rows_from):
    """The q4 route (fp16 d*sc and dmin*m) multiplies nearly the same weights: outputs agree closely, and q4k's
    weights are gguf's exactly where q4's are not."""
    N, K = 96, 2048
    w = random_q4k(N, K, 11)
    old = repack_fast.pack(w.row_blocks(), Q.Q4_K, (N, K), "q4")
    assert isinstance(old, Q4Linear)
    x = torch.randn(12, K, generator=torch.Generator().manual_seed(3))
    a, b = _call(w, x, None, rows_from), _call(old, x, None, rows_from)
    assert ((a - b).norm() / b.norm()).item() < 1.5e-2  # q4 quantizes x per 32, q4k per 256 (Q8_K): ~0.8 % apart
    exact = gguf_weights(w)
    assert torch.equal(w.dequantize(), exact) and not torch.equal(old.dequantize(), exact)


def test_fused_parts_stay_q4k_or_become_the_q8_they_were():
    """All-q4k parts stack as they are; beside a q6 part a q4k part stays q4k (PartsLinear), or, where prompt
    rows take dense weights, becomes q8 with exactly the bits mixed groups had before q4k (Q4_K -> q4 -> q8)."""
    a, b = random_q4k(16, 512, 4), random_q4k(8, 512, 5)
    both = cat_packed([a, b])
    assert isinstance(both, Q4KLinear) and torch.equal(both.row_blocks(), torch.cat([a.row_blocks(), b.row_blocks()]))
    kept = cat_packed([a, random_q6(8, 512, 6)])
    assert isinstance(kept, PartsLinear) and kept.parts[0] is a
    a.jit_dense = True  # a small model's part: its prompt rows take the exact weights
    mixed = cat_packed([a, random_q6(8, 512, 6)])
    assert isinstance(mixed, Q8Linear)
    old = Q8Linear.requantize(repack_fast.pack(a.row_blocks(), Q.Q4_K, (16, 512), "q4"))
    assert torch.equal(mixed.qs[:16], old.qs) and torch.equal(mixed.scale[:16], old.scale)


@pytest.mark.parametrize("N", [12, 48, 64])  # rows as the file has them; 64: whole groups of 16 in each half (q4k16)
def test_loader_keeps_q4_k_as_q4k(N):
    w = random_q4k(N, 768, 7)
    seen = []
    got = repack.from_blocks(w.row_blocks(), Q.Q4_K, (N, 768), "packed", keep_dense=False,
                             done=lambda r0, r1: seen.append(r1))
    assert isinstance(got, Q4KLinear) and got.grouped == (N % 32 == 0)
    assert torch.equal(got.row_blocks(), w.row_blocks()) and got.qs.data_ptr() != w.qs.data_ptr()
    assert seen[-1] == N
    assert repack.kernel_format("Q4_K", "packed") == "q4k" and repack.kernel_format("Q4_K", "q8") == "q8"
    assert repack.kernel_format("Q4_1", "packed") == "q4"
    formats = repack.kernel_formats({"blk.0.attn_q.weight": "Q4_K", "blk.0.attn_k.weight": "Q4_K",
                                     "blk.0.attn_v.weight": "Q4_K", "blk.0.ffn_down.weight": "Q6_K"}, "packed")
    assert set(formats.values()) == {"q4k", "q6"} and formats["blk.0.attn_v.weight"] == "q4k"


@pytest.mark.skipif(not _has_vnni(), reason="no VNNI here: the default build is the AVX2 path, tested above")
def test_the_avx2_build_gives_the_same_bits():
    """The AVX2-only build (PAGEDECK_CPU_ISA=avx2) runs this file too, and its results equal this build's."""
    w = random_q4k(64, 1024, 8, "random bytes")  # whole groups: the q4k16 kernel
    x = torch.randn(20, 1024, generator=torch.Generator().manual_seed(1))
    check = ("from engine.model.qlinear import Q4KLinear; w = Q4KLinear(d['qs']); "
             "assert torch.equal(w(d['x']), d['y']) and torch.equal(w(d['x'][:3]), d['y1'])")
    groups = os.path.join(os.path.dirname(__file__), "test_row_groups.py")
    run_on_isa_build({"qs": w.row_blocks(), "x": x, "y": w(x), "y1": w(x[:3])}, check, [__file__, groups],
                      "not avx2_build and not llama_cpp")


def test_q4_k_file_gives_llama_cpps_logits(tmp_path):
    """A Q4_K file (llama.cpp's quantizer, llama.cpp's logits through the tests.oracles.llamacpp_peer subprocess) read
    packed, every matrix q4k, stays within the quantized fidelity bounds (tests/engine/test_fidelity_llamacpp)."""
    pytest.importorskip("llama_cpp")
    from engine import Model
    from tests.engine.test_fidelity_llamacpp import check
    from tests.llamacpp_fidelity import build

    files = build(tmp_path, [("llama", "F32"), ("llama", "Q4_K")])  # F32: the kl_ref bound
    model = Model.load(files.paths["llama", "Q4_K"], weights="packed")
    formats = {m.format for layer in model.layers for m in vars(layer).values() if hasattr(m, "format")}
    assert "q4k" in formats, formats
    check(files, ("llama", "Q4_K"), "packed")
