"""The q5 format (GGUF Q5_0 / Q5_1 held at 5 bits a weight, kernels/cpu/affine.h): its layout round-trips and
holds gguf's own decode of the file's blocks; its products are the stated arithmetic (q4's, centred at 16) to
fp32 rounding, per-row and GEMM paths bit for bit, every row independent of the others, on both builds (VNNI
and AVX2); the C++ just-in-time decode gives the same bits as the torch one; a file's Q5_0 matrices load as
q5, fused gate|up included, and answer as the file's dense weights do. q5s, Q5_0's blocks read as the file
stores them (what a model starts on), gives q5's bits."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize as gguf_dequantize

from engine.model.packing import repack
from engine.model.qlinear import Q5Linear, Q5SLinear, cat_packed
from kernels import cpu_ext
from kernels.formats import Q5
from kernels.packed import q5_codes, q5_pack
from tests.kernels.test_cpu_kernels import _has_vnni, assert_rows_independent, run_on_isa_build, quantized_activations
from tests.kernels.test_qgemm import _call
from tools.ggml_writers import quantize as quantize_ggml

pytestmark = pytest.mark.skipif(not cpu_ext.available(), reason="pagedeck's CPU kernels did not build here")


def random_q5(N: int, K: int, seed: int = 0, qtype: Q = Q.Q5_0) -> tuple[Q5Linear, torch.Tensor]:
    """A Q5_0 / Q5_1 matrix written by the gguf package, as the loader packs it, and gguf's decode of it."""
    g = torch.Generator().manual_seed(seed)
    src = torch.randn(N, K, generator=g) * (torch.rand(N, 1, generator=g) * 2 + 0.1)
    if qtype == Q.Q5_1:
        src += torch.randn(N, K // 32, 1, generator=g).repeat(1, 1, 32).view(N, K)  # block offsets: m != -16 d
    raw = quantize_ggml(src, qtype)
    exact = torch.from_numpy(gguf_dequantize(raw, qtype).reshape(N, K).astype(np.float32))
    w = repack.from_blocks(torch.from_numpy(raw), qtype, (N, K), keep_dense=False)
    assert isinstance(w, Q5Linear)
    return w, exact


def stated(x: torch.Tensor, w: Q5Linear) -> torch.Tensor:
    """The kernel's arithmetic in float64: per block, d_w (q - 16) against the int8 activations (d_x q_x) plus
    z = m + 16 d_w against the exact block sum of x."""
    N, K = w.shape
    q, dx, s = quantized_activations(x)
    codes = q5_codes(w.qs).view(N, K // 32, 32).double()
    d, m = w.scale[:N].double(), w.minimum[:N].double()
    xq = q * dx[..., None]
    return torch.einsum("nbi,mbi->mn", (codes - 16) * d[..., None], xq) + torch.einsum("nb,mb->mn", m + 16 * d, s)


@pytest.mark.parametrize("nb", [1, 2, 3, 8, 9, 20])
def test_layout_round_trips_every_code(nb):
    codes = torch.randint(0, 32, (7, nb * 32), generator=torch.Generator().manual_seed(nb), dtype=torch.uint8)
    qs = q5_pack(codes)
    assert qs.shape == (7, nb * Q5.code_bytes)
    assert torch.equal(q5_codes(qs), codes)


@pytest.mark.parametrize("qtype", [Q.Q5_0, Q.Q5_1])
def test_holds_the_files_exact_weights_in_five_bits(qtype):
    w, exact = random_q5(24, 544, 1, qtype)  # 17 blocks a row: an odd last block
    assert torch.equal(w.dequantize(), exact)
    ids = torch.tensor([3, 23, 3])
    assert torch.equal(w.embedding(ids), exact[ids])
    out = torch.empty(24, 544)
    cpu_ext.ops().q5_dequantize_into(w.qs, w.scale[:24], w.minimum[:24], out)  # the just-in-time decode
    assert torch.equal(out, exact)
    assert w.nbytes() == repack.packed_nbytes("q5", (24, 544)) == 24 * 17 * (20 + 4)
    assert repack.kernel_format(qtype.name, "packed") == "q5" and repack.decodes_exactly(qtype.name, "q5")


@pytest.mark.parametrize("qtype", [Q.Q5_0, Q.Q5_1])
@pytest.mark.parametrize("N,K,M", [(37, 96, 3), (8, 32, 1), (64, 1024, 5), (33, 736, 40), (16, 2048, 9)])
def test_matmul_computes_its_stated_arithmetic(qtype, N, K, M):
    w, exact = random_q5(N, K, N + K, qtype)
    x = torch.randn(M, K, generator=torch.Generator().manual_seed(M)) * 3
    x[0, 5] = 40.0  # an outlier channel
    if M > 4:
        x[4] = 0.0  # an all-zero row
    rows, gemm = _call(w, x, None, "1000000"), _call(w, x, None, "1")
    assert torch.equal(rows, gemm)  # per-row and GEMM paths: the same bits
    ref = stated(x, w)
    assert ((rows.double() - ref).norm() / ref.norm()).item() < 1e-6
    dense = F.linear(x, exact)  # int8 activations per 32: within a percent of the exact product
    assert ((rows - dense).norm() / dense.norm()).item() < 2e-2


def test_extreme_codes_and_activations_sum_exactly():
    """Codes 31 against full-scale activations (31 x 127 x 2 in AVX2's int16 pairs): no saturation."""
    N, K = 6, 256
    codes = torch.full((N, K), 31, dtype=torch.uint8)
    codes[1::2, ::2] = 0
    scale = torch.full((N, K // 32), 1e-3).half()
    w = Q5Linear(codes, scale, (-16 * scale.float()).half())
    x = torch.full((5, K), 7.0)
    x[1] = -7.0
    x[2, ::2] = -7.0
    for rows_from in ("1", "1000000"):
        y = _call(w, x, None, rows_from)
        assert ((y.double() - stated(x, w)).abs().max() / stated(x, w).abs().max()).item() < 1e-6


def test_a_rows_result_never_depends_on_the_other_rows():
    w, _ = random_q5(70, 1024, 2)
    x = torch.randn(41, 1024)
    assert_rows_independent(w, x, (0, 5, 13, 40), (2, 9))


def test_swiglu_epilogue_and_fused_parts():
    gate, _ = random_q5(96, 640, 3)
    up, _ = random_q5(96, 640, 4)
    both = cat_packed([gate, up])
    assert isinstance(both, Q5Linear) and both.shape == (192, 640)
    x = torch.randn(9, 640)
    torch.testing.assert_close(both(x), torch.cat([gate(x), up(x)], -1), rtol=0, atol=0)
    g, u = both(x).chunk(2, dim=-1)
    torch.testing.assert_close(both(x, "swiglu"), F.silu(g) * u, rtol=1e-5, atol=1e-6)
    assert torch.equal(_call(both, x, "swiglu", "1"), _call(both, x, "swiglu", "1000000"))


@pytest.mark.parametrize("N,K,M", [(64, 1056, 1), (37, 96, 3), (48, 640, 5), (64, 1056, 23), (40, 2048, 130)])
def test_q5s_gives_q5s_bits(N, K, M):
    """Q5_0's blocks read as stored (a model's start on its mapped file) give the bits of the same blocks moved
    into q5's layout (what it settles into) for every row count, per-row and GEMM paths, pairs and an odd last
    block (K 1056: 33 blocks), SwiGLU's epilogue too; and decode to gguf's own weights."""
    g = torch.Generator().manual_seed(N + M)
    raw = torch.from_numpy(quantize_ggml(torch.randn(N, K, generator=g) * 0.05, Q.Q5_0)).reshape(N, -1)
    stored = Q5SLinear(raw)
    moved = repack.from_blocks(raw, Q.Q5_0, (N, K), keep_dense=False)
    assert isinstance(moved, Q5Linear) and stored.nbytes() == raw.numel()
    x = torch.randn(M, K, generator=g) * 2
    x[0, 3] = 30.0
    for rows in ("1", "1000000"):
        assert torch.equal(_call(stored, x, None, rows), _call(moved, x, None, rows))
        if N % 2 == 0:
            assert torch.equal(_call(stored, x, "swiglu", rows), _call(moved, x, "swiglu", rows))
    exact = torch.from_numpy(gguf_dequantize(raw.numpy(), Q.Q5_0).reshape(N, K).astype(np.float32))
    assert torch.equal(stored.dequantize(), exact)
    assert torch.equal(stored.embedding(torch.tensor([0, N - 1])), moved.embedding(torch.tensor([0, N - 1])))


def test_gemma_like_file_loads_q5_and_answers_as_its_dense_weights(tmp_path):
    """The Q4_K_M recipe on 640-wide rows writes Q5_0 (llama.cpp's fallback), as Gemma 3 270M's files have:
    those matrices load as q5, and decode steps stay near the dense model's logits."""
    from engine import Model
    from tools.logits import forward_tokens
    from tools.models.synthetic_gguf import write_random_gguf

    path = write_random_gguf(tmp_path / "g.gguf", "gemma3-270m", 1, "Q4_K_M", tied=True)
    packed = Model.load(path, weights="packed", check_memory=False)
    kinds = {m.format for layer in packed.layers for m in vars(layer).values() if hasattr(m, "format")}
    assert "q5" in kinds, kinds
    dense = Model.load(path, weights="dense", check_memory=False)
    ids = torch.randint(20, 2000, (1, 12), generator=torch.Generator().manual_seed(0))
    want = forward_tokens(dense, ids)
    got = forward_tokens(packed, ids, prompt=False)  # as decode steps: the packed kernels, int8 activations
    assert ((got - want).norm() / want.norm()).item() < 3e-2


@pytest.mark.skipif(not _has_vnni(), reason="no VNNI here: the default build is the AVX2 path, tested above")
def test_the_avx2_build_gives_the_same_bits():
    """The AVX2-only build (PAGEDECK_CPU_ISA=avx2: maddubs, the shuffle spread of the fifth bits) runs this file
    too, and its results equal this build's."""
    w, _ = random_q5(64, 1056, 8)  # 33 blocks: pairs and an odd last block
    x = torch.randn(20, 1056, generator=torch.Generator().manual_seed(1))
    check = ("from engine.model.qlinear import Q5Linear; w = Q5Linear.from_packed(d['qs'], d['d'], d['m']); "
             "assert torch.equal(w(d['x']), d['y']) and torch.equal(w(d['x'][:3]), d['y1'])")
    run_on_isa_build({"qs": w.qs, "d": w.scale, "m": w.minimum, "x": x, "y": w(x), "y1": w(x[:3])}, check,
                      [__file__], "not avx2_build and not gemma_like")
