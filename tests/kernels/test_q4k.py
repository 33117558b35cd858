"""The q4k format (GGUF Q4_K super-blocks kept as the file stores them, kernels/cpu/q4k.h): its weights are
gguf's own decode of the bytes; its products are the float64 statement of its integer arithmetic row by row,
per-row and GEMM paths bit for bit, on both builds (VNNI and AVX2); it stays near the q4 repack it replaced;
the loader keeps Q4_K as q4k, fuses all-Q4_K groups by copying rows, and mixed groups keep their old q8 bits;
and a Q4_K file's logits stay within the fidelity bounds against llama.cpp."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize as gguf_dequantize

from engine.model import repack, repack_fast
from engine.model.ggml_blocks import q4_k_affine
from engine.model.qlinear import Q4KLinear, Q4Linear, Q8Linear, cat_packed
from kernels import cpu_ext
from tests.kernels.test_cpu_kernels import _has_vnni, quantized_activations
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
    return torch.from_numpy(gguf_dequantize(w.qs.numpy(), Q.Q4_K).astype(np.float32)).view(w.shape)


def reference_q4k(x: torch.Tensor, w: Q4KLinear) -> torch.Tensor:
    """What the kernel computes, in float64: per block of 32, d sc d_x sum((q - 8) q_x) + (8 d sc - dmin m) sum(x)
    (q_x the kernel's int8 activations, sum(x) the exact one)."""
    q, dx, sx = quantized_activations(x)
    N, K = w.shape
    codes, scale, minimum = q4_k_affine(w.qs.reshape(-1, 144))  # w = scale q - minimum, fp32 products (exact)
    codes = codes.double().view(N, K // 32, 32) - 8
    scale, minimum = scale.double().view(N, K // 32), minimum.double().view(N, K // 32)
    dots = torch.einsum("mjk,njk->mnj", q, codes)
    return (dots * scale[None] * dx[:, None, :] + (8 * scale - minimum)[None] * sx[:, None, :]).sum(-1)


@pytest.mark.parametrize("source", ["writer", "random bytes"])
@pytest.mark.parametrize("N,K,M", [(37, 768, 9), (8, 256, 1), (64, 4096, 5), (5, 512, 16)])
def test_q4k_matmul_computes_its_stated_arithmetic(source, N, K, M):
    w = random_q4k(N, K, N + K, source)
    x = torch.randn(M, K, generator=torch.Generator().manual_seed(M)) * 3
    x[0, 5] = 40.0  # an outlier channel
    if M > 4:
        x[4] = 0.0  # an all-zero row
    y = w(x)
    expected = reference_q4k(x, w)
    torch.testing.assert_close(y.double(), expected, rtol=1e-5, atol=1e-5 * expected.abs().max().item())
    dense = F.linear(x, gguf_weights(w))
    assert ((y - dense).norm() / dense.norm()).item() < 2e-2


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
    x = torch.full((5, K), 7.0)
    x[1] = -7.0
    x[2, ::2] = -7.0
    torch.testing.assert_close(w(x).double(), reference_q4k(x, w), rtol=1e-6, atol=1e-6)


def test_a_rows_result_never_depends_on_the_other_rows():
    w = random_q4k(70, 1024, 2, "random bytes")
    x = torch.randn(41, 1024)
    together = w(x)
    for i in (0, 5, 13, 40):
        assert torch.equal(w(x[i : i + 1]), together[i : i + 1])
    assert torch.equal(w(x[2:9]), together[2:9])
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert torch.equal(w(x), together)
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("N,K,M", [(40, 1024, 23), (5, 256, 16), (33, 768, 9)])  # a last panel of 8, 5, 1 columns
def test_gemm_path_gives_the_per_row_paths_bits(N, K, M):
    """Prompt rows (qgemm.h's q4 tile over q4k.h's panels) must give the per-row path's bits for every element."""
    w = random_q4k(N, K, N * K, "random bytes")
    x = torch.randn(M, K, generator=torch.Generator().manual_seed(M)) * 3
    x[1, 7] = 40.0
    x[2] = 0.0
    gemm = _call(w, x, None, "1")
    assert torch.equal(gemm, _call(w, x, None, "1000000"))
    expected = reference_q4k(x, w)
    torch.testing.assert_close(gemm.double(), expected, rtol=1e-5, atol=1e-5 * expected.abs().max().item())
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
    old = repack_fast.pack(w.qs, Q.Q4_K, (N, K), "q4")
    assert isinstance(old, Q4Linear)
    x = torch.randn(12, K, generator=torch.Generator().manual_seed(3))
    a, b = _call(w, x, None, rows_from), _call(old, x, None, rows_from)
    assert ((a - b).norm() / b.norm()).item() < 2e-3
    exact = gguf_weights(w)
    assert torch.equal(w.dequantize(), exact) and not torch.equal(old.dequantize(), exact)


def test_fused_parts_stay_q4k_or_become_the_q8_they_were():
    """All-q4k parts stack as they are; beside a q6 part a q4k part becomes q8 with exactly the bits mixed
    groups had before q4k (Q4_K -> q4 -> q8)."""
    a, b = random_q4k(16, 512, 4), random_q4k(8, 512, 5)
    both = cat_packed([a, b])
    assert isinstance(both, Q4KLinear) and torch.equal(both.qs, torch.cat([a.qs, b.qs]))
    mixed = cat_packed([a, random_q6(8, 512, 6)])
    assert isinstance(mixed, Q8Linear)
    old = Q8Linear.requantize(repack_fast.pack(a.qs, Q.Q4_K, (16, 512), "q4"))
    assert torch.equal(mixed.qs[:16], old.qs) and torch.equal(mixed.scale[:16], old.scale)


def test_loader_keeps_q4_k_as_q4k():
    w = random_q4k(12, 768, 7)
    seen = []
    got = repack.from_blocks(w.qs, Q.Q4_K, (12, 768), "packed", keep_dense=False, done=lambda r0, r1: seen.append(r1))
    assert isinstance(got, Q4KLinear) and torch.equal(got.qs, w.qs) and got.qs.data_ptr() != w.qs.data_ptr()
    assert seen[-1] == 12
    assert repack.kernel_format("Q4_K", "packed") == "q4k" and repack.kernel_format("Q4_K", "q8") == "q8"
    assert repack.kernel_format("Q4_1", "packed") == "q4"
    formats = repack.kernel_formats({"blk.0.attn_q.weight": "Q4_K", "blk.0.attn_k.weight": "Q4_K",
                                     "blk.0.attn_v.weight": "Q4_K", "blk.0.ffn_down.weight": "Q6_K"}, "packed")
    assert set(formats.values()) == {"q4k", "q6"} and formats["blk.0.attn_v.weight"] == "q4k"


@pytest.mark.skipif(not _has_vnni(), reason="no VNNI here: the default build is the AVX2 path, tested above")
def test_the_avx2_build_gives_the_same_bits():
    """The AVX2-only build (PAGEDECK_CPU_ISA=avx2) runs this file too, and its results equal this build's."""
    w = random_q4k(40, 1024, 8, "random bytes")
    x = torch.randn(20, 1024, generator=torch.Generator().manual_seed(1))
    torch.save({"qs": w.qs, "x": x, "y": w(x), "y1": w(x[:3])},
               path := os.path.join(os.environ.get("TMPDIR", "/tmp"), f"q4k_bits_{os.getpid()}.pt"))
    check = ("import torch; from engine.model.qlinear import Q4KLinear; d = torch.load(%r); w = Q4KLinear(d['qs']); "
             "assert torch.equal(w(d['x']), d['y']) and torch.equal(w(d['x'][:3]), d['y1'])" % path)
    env = dict(os.environ, PAGEDECK_CPU_ISA="avx2")
    try:
        run = subprocess.run([sys.executable, "-c", check], env=env, capture_output=True, text=True, timeout=900)
        assert run.returncode == 0, run.stderr[-3000:]
        run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__, "-k",
                              "not avx2_build and not llama_cpp"], env=env, capture_output=True, text=True,
                             timeout=900)
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
        assert " passed" in run.stdout
    finally:
        os.unlink(path)


def test_q4_k_file_gives_llama_cpps_logits(tmp_path):
    """A Q4_K file (llama.cpp's quantizer, llama.cpp's logits through the tools.llamacpp_peer subprocess) read
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
