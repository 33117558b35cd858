"""Triton paged attention (decode split-KV and varlen prefill) through Triton's CPU interpreter, against
the oracle: shuffled non-contiguous pages, NaN in every unwritten slot, poisoned outputs, GQA 1/3/8,
page sizes 16 and 256, lengths that are not multiples of the page size."""

from __future__ import annotations

import pytest
import torch

from tests.kernels.test_oracle import PagedCase

triton = pytest.importorskip("triton")

from kernels import triton_ops  # noqa: E402
from kernels.triton_decode import choose_splits, decode_attention  # noqa: E402
from kernels.triton_prefill import prefill_attention  # noqa: E402

F32, F16 = torch.float32, torch.float16
TOL = {F32: dict(atol=1e-5, rtol=1e-5), F16: dict(atol=5e-3, rtol=1e-2)}


def _poisoned(case):
    return torch.full_like(case.q, float("nan"))


def _decode_lens(ps):
    return [(1, 1), (1, 37), (1, ps + 44), (1, 2 * ps - 1)]


@pytest.mark.parametrize(
    "Hq,Hkv,ps,dtype,splits,D",
    [
        (2, 2, 16, F32, 1, 32),
        (6, 2, 16, F16, 3, 32),
        (8, 1, 16, F32, 4, 48),
        (2, 2, 256, F16, 2, 32),
        (6, 2, 256, F32, 1, 32),
        (8, 1, 256, F16, 5, 32),
    ],
)
def test_decode_attention(Hq, Hkv, ps, dtype, splits, D):
    case = PagedCase(_decode_lens(ps), Hq, Hkv, D, ps, num_pages=32768 // ps, dtype=dtype, seed=Hq + ps + splits)
    out = _poisoned(case)
    decode_attention(case.q, case.k_cache, case.v_cache, case.block_table, case.kv, case.scale,
                     num_splits=splits, out=out)
    assert not out.isnan().any()
    torch.testing.assert_close(out.float(), case.expected(), **TOL[dtype])


def _mixed(ps):
    return [(1, 37), (5, ps + 44), (40, 40), (19, 70), (1, 1), (3, 2 * ps - 3)]


@pytest.mark.parametrize(
    "Hq,Hkv,ps,dtype,D",
    [(3, 3, 16, F16, 32), (6, 2, 16, F32, 48), (8, 1, 16, F16, 32),
     (2, 2, 256, F32, 32), (6, 2, 256, F16, 32), (16, 2, 256, F32, 32)],
)
def test_prefill_attention(Hq, Hkv, ps, dtype, D):
    case = PagedCase(_mixed(ps), Hq, Hkv, D, ps, num_pages=32768 // ps, dtype=dtype, seed=7 * Hq + ps)
    out = _poisoned(case)
    prefill_attention(*case.args(), out=out)
    assert not out.isnan().any()
    torch.testing.assert_close(out.float(), case.expected(), **TOL[dtype])


def test_prefill_many_query_blocks_per_sequence():
    """Small tiles: several query blocks per sequence, so the grid's block->sequence search and the
    per-block causal limit are exercised across block boundaries."""
    case = PagedCase([(50, 50), (33, 100), (3, 3), (17, 17)], 2, 2, 32, 16, seed=11)
    out = _poisoned(case)
    prefill_attention(*case.args(), block_rows=16, block_n=16, out=out)
    torch.testing.assert_close(out, case.expected(), **TOL[F32])


def test_dispatch_picks_decode_or_varlen_by_shape():
    dec = PagedCase([(1, 20), (1, 75)], 6, 2, 32, 16, seed=5)
    torch.testing.assert_close(triton_ops.paged_attention(*dec.args()), dec.expected(), **TOL[F32])
    ver = PagedCase([(4, 20), (4, 75)], 6, 2, 32, 16, seed=6)  # speculative verification shape
    torch.testing.assert_close(triton_ops.paged_attention(*ver.args()), ver.expected(), **TOL[F32])


@pytest.mark.parametrize("window,softcap", [(1, None), (40, None), (300, 20.0), (None, 5.0)])
@pytest.mark.parametrize("dtype", [F32, F16])
def test_decode_sliding_window_and_softcap(window, softcap, dtype):
    """Splits start at kv_len - window, so pages before the window (NaN here when unwritten) are never read."""
    case = PagedCase(_decode_lens(16) + [(1, 600)], 6, 2, 32, 16, dtype=dtype, seed=9)
    case.q *= 4  # large scores: capping changes the result
    for splits in (1, 3):
        out = _poisoned(case)
        decode_attention(case.q, case.k_cache, case.v_cache, case.block_table, case.kv, case.scale,
                         num_splits=splits, out=out, window=window, softcap=softcap)
        assert not out.isnan().any()
        torch.testing.assert_close(out.float(), case.expected(window, softcap), **TOL[dtype])


@pytest.mark.parametrize("window,softcap", [(1, None), (23, None), (70, 20.0), (None, 5.0)])
@pytest.mark.parametrize("dtype", [F32, F16])
def test_prefill_sliding_window_and_softcap(window, softcap, dtype):
    """Small tiles, so rows of one query block see different kv tiles: a row whose window starts after
    the block's first kv tile must not turn the running max into NaN."""
    case = PagedCase(_mixed(16), 6, 2, 32, 16, dtype=dtype, seed=13)
    case.q *= 4
    out = _poisoned(case)
    prefill_attention(*case.args(), block_rows=16, block_n=16, out=out, window=window, softcap=softcap)
    assert not out.isnan().any()
    torch.testing.assert_close(out.float(), case.expected(window, softcap), **TOL[dtype])
    disp = triton_ops.paged_attention(*case.args(), window=window, softcap=softcap)
    torch.testing.assert_close(disp.float(), case.expected(window, softcap), **TOL[dtype])


def test_split_heuristic():
    assert choose_splits(64, 8, 32768, 132) == 1  # batch x heads already fills the GPU
    assert choose_splits(1, 8, 32768, 132) == 33
    assert choose_splits(1, 8, 300, 132) == 2  # never splits shorter than ~256 tokens
    assert choose_splits(1, 1, 10**7, 132) == 64


@pytest.mark.parametrize("window", [None, 23])
@pytest.mark.parametrize("dtype", [F32, F16])
def test_attention_sinks(window, dtype):
    """gpt-oss's sinks (one logit per head, no value) in decode, written directly and merged over splits, and
    in prefill, against the torch reference path (itself held to transformers' gpt-oss); sinks around the
    scores' size take a real share of each softmax, and one far above them leaves almost nothing."""
    from kernels import reference_attention

    for sink_scale, shift in ((1.0, 0.0), (1.0, 30.0)):
        g = torch.Generator().manual_seed(5)
        sinks = (torch.randn(6, generator=g) * sink_scale + shift).to(dtype)
        for seqs in (_decode_lens(16) + [(1, 600)], _mixed(16)):
            case = PagedCase(seqs, 6, 2, 32, 16, dtype=dtype, seed=11)
            want = reference_attention.paged_attention(*case.args(), window=window, sinks=sinks).float()
            without = reference_attention.paged_attention(*case.args(), window=window).float()
            assert (want - without).abs().max() > 0.1  # the sinks matter in this case
            runs = [triton_ops.paged_attention(*case.args(), window=window, sinks=sinks)]
            if len(seqs) == case.q.shape[0]:
                for splits in (1, 3):
                    runs.append(decode_attention(case.q, case.k_cache, case.v_cache, case.block_table, case.kv,
                                                 case.scale, num_splits=splits, window=window,
                                                 sinks=sinks.float()))
            for got in runs:
                assert not got.isnan().any()
                torch.testing.assert_close(got.float(), want, **TOL[dtype])
