"""The prompt-rows (GEMM) path of the packed matmul (kernels/cpu/qgemm.h) against the per-weight-row path and
the float64 statement of the arithmetic: the two paths must give the same bits for every element, so a row's
result never depends on how many rows share its call (a prompt row equals the same row decoded alone)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from engine.model.qlinear import Q8Linear
from kernels import cpu_ext
from tests.kernels.test_cpu_kernels import _has_vnni, assert_rows_independent, random_q4, reference_matmul

pytestmark = pytest.mark.skipif(not cpu_ext.available(), reason="pagedeck's CPU kernels did not build here")
ROOT = Path(__file__).resolve().parents[2]


def _call(w, x, act, rows_from: str):
    """w(x) with the GEMM path taken from `rows_from` activation rows on (PAGEDECK_QGEMM_ROWS's override)."""
    with cpu_ext.tuning(qgemm_rows=int(rows_from)):
        return w(x, act) if act else w(x)


def _weights(fmt: str, N: int, K: int):
    return random_q4(N, K, N + K) if fmt == "q4" else Q8Linear.quantize(torch.randn(N, K) * 0.05)


@pytest.mark.parametrize("fmt", ["q4", "q8"])
@pytest.mark.parametrize("N,K,M", [(96, 576, 40), (37, 544, 17), (5, 32, 16), (70, 1536, 23),  # odd N, K/32 17, 1
                                   (48, 576, 6), (48, 576, 7)])  # per-row tails of 2 and 3 rows
def test_gemm_path_gives_the_per_row_paths_bits(fmt, N, K, M):
    w = _weights(fmt, N, K)
    x = torch.randn(M, K, generator=torch.Generator().manual_seed(M)) * 3
    x[3, 5] = 40.0  # an outlier channel
    x[4] = 0.0  # an all-zero row
    gemm = _call(w, x, None, "1")
    assert torch.equal(gemm, _call(w, x, None, "1000000"))
    expected = reference_matmul(x, w)
    torch.testing.assert_close(gemm.double(), expected, rtol=1e-5, atol=1e-5 * expected.abs().max().item())


@pytest.mark.parametrize("fmt", ["q4", "q8"])
def test_a_prompt_row_equals_the_same_row_alone(fmt):
    """The default switch (8 rows): rows of a 40-row call take the GEMM path, a single row the decode path."""
    w = _weights(fmt, 72, 576)
    x = torch.randn(40, 576)
    assert_rows_independent(w, x, (0, 13, 39))


@pytest.mark.parametrize("fmt", ["q4", "q8"])
@pytest.mark.parametrize("N", [192, 180])  # 180: a last panel of 10 gate/up columns
def test_gemm_swiglu_epilogue_gives_the_per_row_paths_bits(fmt, N):
    w = _weights(fmt, N, 576)
    x = torch.randn(21, 576)
    gemm = _call(w, x, "swiglu", "1")
    assert torch.equal(gemm, _call(w, x, "swiglu", "1000000"))
    gate, up = _call(w, x, None, "1").chunk(2, dim=-1)
    torch.testing.assert_close(gemm, torch.nn.functional.silu(gate) * up, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("fmt", ["q4", "q8"])
def test_gemm_extreme_codes_sum_exactly(fmt):
    """Full-scale codes against full-scale activations (AVX2's maddubs saturates on q8's stored 255 x 127)."""
    from engine.model.qlinear import Q4Linear

    N, K = 16, 256
    signs = torch.ones(N, K)
    signs[1::2, ::2] = -1
    signs[2] = -1
    if fmt == "q4":
        base = random_q4(N, K, 5)
        w = Q4Linear(torch.where(signs > 0, 15, 0).to(torch.uint8), base.scale.float(), base.minimum.float())
    else:
        w = Q8Linear.quantize(signs * 0.5)
    x = torch.cat([signs, -signs, torch.full((2, K), 3.0)]) * 2.5
    gemm = _call(w, x, None, "1")
    torch.testing.assert_close(gemm.double(), reference_matmul(x, w), rtol=1e-6, atol=1e-6)
    assert torch.equal(gemm, _call(w, x, None, "1000000"))


def test_the_path_switches_reach_the_kernels(monkeypatch):
    """PAGEDECK_QGEMM_ROWS and PAGEDECK_ROW_CHUNK go into the C++ kernels (which never read the environment):
    when they load in a fresh process, again once engine.envs reads a changed value, and set_tuning overrides
    them for a block."""
    code = "from kernels import cpu_ext; print(cpu_ext.current_tuning())"
    run = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, PAGEDECK_QGEMM_ROWS="3",
                         PAGEDECK_ROW_CHUNK="0"), capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.strip() == "(3, 0)"
    monkeypatch.setenv("PAGEDECK_QGEMM_ROWS", "5")
    monkeypatch.delenv("PAGEDECK_ROW_CHUNK", raising=False)
    cpu_ext.ops()
    assert cpu_ext.current_tuning() == (5, None)
    with cpu_ext.tuning(qgemm_rows=None, row_chunk=64):
        assert cpu_ext.current_tuning() == (None, 64)
    assert cpu_ext.current_tuning() == (5, None)


@pytest.mark.skipif(not _has_vnni(), reason="no VNNI here: the default build is the AVX2 path, tested above")
def test_the_avx2_build_of_the_gemm_path_gives_the_same_bits():
    """The AVX2-only build (PAGEDECK_CPU_ISA=avx2: maddubs, q8 through |q| x sign(x, q)) runs this file too."""
    env = dict(os.environ, PAGEDECK_CPU_ISA="avx2")
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__, "-k",
                          "not avx2_build"], env=env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert " passed" in run.stdout
