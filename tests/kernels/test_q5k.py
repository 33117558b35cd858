"""The q5k format (GGUF Q5_K super-blocks kept as the file stores them, multiplied by q4k's kernels read through
Q5_K's layout, kernels/cpu/q4k.h): its weights are gguf's own decode of the bytes; its products are llama.cpp's
Q5_K x Q8_K integer arithmetic to the bit (tests/kernels/test_q4k.py's NumPy statement, codes 0..31), per-row
and GEMM paths bit for bit, on both builds (VNNI and AVX2); the loader keeps Q5_K as q5k; and a Q5_K_M file
made by llama.cpp's quantizer loads keeping its Q5_K matrices and stays within the fidelity bounds."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize as gguf_dequantize

from engine.model.packing import repack
from engine.model.qlinear.superblock import Q5KLinear
from kernels import cpu_ext, formats
from kernels.packed import native_group
from tests.kernels.test_cpu_kernels import _has_vnni, assert_rows_independent, run_on_isa_build
from tests.kernels.test_q4k import full_scale_activations, q4_k_fields, reference_superblocks
from tests.kernels.test_qgemm import _call

pytestmark = pytest.mark.skipif(not cpu_ext.available(), reason="pagedeck's CPU kernels did not build here")


def random_q5k(N: int, K: int, seed: int = 0) -> Q5KLinear:
    """Random block bytes (every code, fifth bit, 6-bit scale and minimum) with small finite d and dmin."""
    g = torch.Generator().manual_seed(seed)
    raw = torch.randint(0, 256, (N * K // 256, 176), generator=g, dtype=torch.uint8)
    raw[:, 0:4] = (torch.rand(raw.shape[0], 2, generator=g) * 1e-3).half().view(torch.uint8).view(-1, 4)
    return Q5KLinear(raw.reshape(N, -1))


def gguf_weights(w: Q5KLinear) -> torch.Tensor:
    """gguf-py's own Q5_K decoder: the oracle of the weights."""
    return torch.from_numpy(gguf_dequantize(w.row_blocks().numpy(), Q.Q5_K).astype(np.float32)).view(w.shape)


def q5_k_fields(qs: torch.Tensor, N: int, K: int) -> tuple[np.ndarray, ...]:
    """d, dmin, sc, m and codes 0..31 as ggml's dequantize_row_q5_K reads the bytes: a Q4_K super-block (the
    first 16 bytes and the 128 nibble bytes) plus 16 where bit b of qh[t] is set, for weight t of sub-block b."""
    b = qs.reshape(N, K // 256, 176)
    d, dmin, sc, m, codes = q4_k_fields(torch.cat([b[..., :16], b[..., 48:]], -1).contiguous(), N, K)
    qh = b[..., 16:48].numpy().astype(np.int64)  # (N, S, 32)
    high = (qh[:, :, None, :] >> np.arange(8)[None, None, :, None]) & 1  # (N, S, 8 sub-blocks, 32)
    return d, dmin, sc, m, codes + 16 * high


def reference_q5k(x: torch.Tensor, w: Q5KLinear) -> torch.Tensor:
    return reference_superblocks(x, w.shape[1], *q5_k_fields(w.row_blocks(), *w.shape))


def test_the_fields_decode_as_gguf_does():
    w = random_q5k(6, 512, 1)
    d, dmin, sc, m, codes = q5_k_fields(w.row_blocks(), 6, 512)
    weights = d[..., None, None] * sc[..., None] * codes - dmin[..., None, None] * m[..., None]
    assert np.array_equal(weights.reshape(6, 512).astype(np.float32), gguf_weights(w).numpy())
    assert codes.max() == 31 and codes.min() == 0


@pytest.mark.parametrize("N,K,M", [(37, 768, 9), (8, 256, 1), (64, 4096, 5), (5, 512, 16)])
def test_q5k_matmul_computes_its_stated_arithmetic(N, K, M):
    w = random_q5k(N, K, N + K)
    x = torch.randn(M, K, generator=torch.Generator().manual_seed(M)) * 3
    x[0, 5] = 40.0  # an outlier channel
    if M > 4:
        x[4] = 0.0  # an all-zero row
    y = w(x)
    assert torch.equal(y, reference_q5k(x, w))
    dense = F.linear(x, gguf_weights(w))
    assert ((y - dense).norm() / dense.norm()).item() < 5e-2


def test_q5k_keeps_the_files_exact_weights_and_size():
    w = random_q5k(24, 512, 1)
    exact = gguf_weights(w)
    assert torch.equal(w.dequantize(), exact)
    ids = torch.tensor([3, 23, 3])
    assert torch.equal(w.embedding(ids), exact[ids])
    assert w.nbytes() == 24 * 512 // 256 * 176 == repack.packed_nbytes("q5k", (24, 512))
    assert w.nbytes() * 8 / w.numel() == 5.5 and w.kernel_id == formats.Q5K.kernel_id


def test_extreme_codes_scales_and_activations_sum_exactly():
    """Codes 31 with scales and minimums 63 against full-scale activations: no int16 or int32 overflow."""
    N, K = 6, 512
    raw = torch.zeros(N * K // 256, 176, dtype=torch.uint8)
    raw[:, 0:4] = torch.tensor([1e-3, 5e-4]).half().view(torch.uint8)
    raw[:, 4:16] = 0xFF  # every 6-bit scale and minimum 63
    raw[:, 16:] = 0xFF  # every code 31
    raw[1::2, 16:48] = 0x55  # fifth bits of sub-blocks 0, 2, 4, 6 only
    w = Q5KLinear(raw.reshape(N, -1))
    x = full_scale_activations(K)
    assert torch.equal(w(x), reference_q5k(x, w))
    assert torch.equal(_call(w, x, None, "1"), reference_q5k(x, w))


def test_a_rows_result_never_depends_on_the_other_rows():
    w = random_q5k(70, 1024, 2)
    x = torch.randn(41, 1024)
    assert_rows_independent(w, x, (0, 5, 13, 40), (2, 9))


@pytest.mark.parametrize("N,K,M", [(40, 1024, 23), (5, 256, 16), (33, 768, 9)])  # a last panel of 8, 5, 1 columns
def test_gemm_path_gives_the_per_row_paths_bits(N, K, M):
    w = random_q5k(N, K, N * K)
    x = torch.randn(M, K, generator=torch.Generator().manual_seed(M)) * 3
    x[1, 7] = 40.0
    x[2] = 0.0
    gemm = _call(w, x, None, "1")
    assert torch.equal(gemm, _call(w, x, None, "1000000"))
    assert torch.equal(gemm, reference_q5k(x, w))
    if N % 2 == 0:
        assert torch.equal(_call(w, x, "swiglu", "1"), _call(w, x, "swiglu", "1000000"))


@pytest.mark.parametrize("N", [12, 64])
def test_loader_keeps_q5_k_as_q5k(N):
    w = random_q5k(N, 768, 7)
    seen = []
    got = repack.from_blocks(w.row_blocks(), Q.Q5_K, (N, 768), "packed", keep_dense=False,
                             done=lambda r0, r1: seen.append(r1))
    # groups where the group kernel is vectorized and the rows make whole groups in each SwiGLU half
    assert isinstance(got, Q5KLinear) and got.grouped == (N == 64 and native_group(formats.Q5K.grouped_id))
    assert torch.equal(got.row_blocks(), w.row_blocks()) and got.qs.data_ptr() != w.qs.data_ptr()
    assert seen[-1] == N
    assert repack.kernel_format("Q5_K", "packed") == "q5k" and repack.kernel_format("Q5_K", "q8") == "q8"
    assert repack.decodes_exactly("Q5_K", "q5k")


@pytest.mark.skipif(not _has_vnni(), reason="no VNNI here: the default build is the AVX2 path, tested above")
def test_the_avx2_build_gives_the_same_bits():
    """The AVX2-only build (PAGEDECK_CPU_ISA=avx2) runs this file too, and its results equal this build's."""
    w = random_q5k(64, 1024, 8)
    x = torch.randn(20, 1024, generator=torch.Generator().manual_seed(1))
    check = ("from engine.model.qlinear.superblock import Q5KLinear; w = Q5KLinear(d['qs']); "
             "assert torch.equal(w(d['x']), d['y']) and torch.equal(w(d['x'][:3]), d['y1'])")
    run_on_isa_build({"qs": w.row_blocks(), "x": x, "y": w(x), "y1": w(x[:3])}, check, [__file__],
                      "not avx2_build and not llama_cpp")


def test_q5_k_files_keep_q5_k_and_give_llama_cpps_logits(tmp_path):
    """A Q5_K file (every matrix Q5_K) and llama.cpp's own Q5_K_M of the same model (its quantizer and per-layer
    recipe), read packed: their Q5_K matrices are q5k, and both files' logits stay within the quantized
    fidelity bounds against llama.cpp's (tests/engine/test_fidelity_llamacpp)."""
    pytest.importorskip("llama_cpp")
    from engine import Model
    from tests.engine.test_fidelity_llamacpp import check
    from tests.llamacpp_fidelity import build
    from tests.oracles.llamacpp_peer import run_jobs
    from tools.models._llamacpp_quantized import quantize, tensor_types

    files = build(tmp_path, [("llama", "F32"), ("llama", "Q5_K")])  # F32: the kl_ref bound
    mixed = quantize(files.paths["llama", "F32"], tmp_path / "llama-Q5_K_M.gguf", "Q5_K_M")
    assert "Q5_K" in set(tensor_types(mixed).values())
    out = mixed.with_suffix(".npy")
    (result,) = run_jobs([{"op": "logits", "model": str(mixed), "ids": files.ids, "out": str(out)}], tmp_path)
    files.paths["llama", "Q5_K_M"], files.peer["llama", "Q5_K_M"] = mixed, {**result, "out": str(out)}
    for qtype in ("Q5_K", "Q5_K_M"):
        model = Model.load(files.paths["llama", qtype], weights="packed")
        seen = {m.format for layer in model.layers for m in vars(layer).values() if hasattr(m, "format")}
        assert "q5k" in seen, (qtype, seen)
        check(files, ("llama", qtype), "packed")
