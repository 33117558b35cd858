"""Triton dequant-matmul kernels (decode GEMV, prefill GEMM) on GGUF blocks as stored, through the CPU
interpreter, against the gguf package's numpy decode + matmul: every supported type, ragged N and M."""

from __future__ import annotations

import pytest
import torch
from gguf import GGMLQuantizationType as Q

from kernels.reference import dequant_matmul_reference
from tools.ggml_writers import quantize as quantize_ggml

pytest.importorskip("triton")

from kernels import triton_dequant  # noqa: E402

TYPES = [Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q4_K, Q.Q5_K, Q.Q6_K]


def case(qtype, n=80, k=512, m=3, seed=0):
    g = torch.Generator().manual_seed(seed + int(qtype))
    w = torch.randn(n, k, generator=g) * torch.rand(n, 1, generator=g) * 2
    raw = torch.from_numpy(quantize_ggml(w, qtype)).reshape(n, -1).contiguous()
    x = torch.randn(m, k, generator=g)
    return x, raw


@pytest.mark.parametrize("qtype", TYPES, ids=[t.name for t in TYPES])
def test_gemv_matches_reference(qtype):
    x, raw = case(qtype)
    want = dequant_matmul_reference(x, raw, int(qtype), (80, 512))
    got = triton_dequant.dequant_gemv(x, raw, int(qtype), (80, 512))
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("qtype", TYPES, ids=[t.name for t in TYPES])
def test_gemm_matches_reference(qtype):
    x, raw = case(qtype, m=40)
    want = dequant_matmul_reference(x, raw, int(qtype), (80, 512))
    got = triton_dequant.dequant_gemm(x, raw, int(qtype), (80, 512))
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


def test_gemv_fp16_activations_and_bad_arguments():
    x, raw = case(Q.Q4_K, m=2)
    want = dequant_matmul_reference(x, raw, int(Q.Q4_K), (80, 512))
    got = triton_dequant.dequant_gemv(x.half(), raw, int(Q.Q4_K), (80, 512))
    torch.testing.assert_close(got.float(), want, atol=0.1, rtol=1e-2)
    with pytest.raises(ValueError, match="no dequant-matmul kernel"):
        triton_dequant.dequant_gemv(x, raw, int(Q.IQ4_XS), (80, 512))
    with pytest.raises(ValueError, match="raw must be uint8"):
        triton_dequant.dequant_gemv(x, raw[:, :-1], int(Q.Q4_K), (80, 512))
