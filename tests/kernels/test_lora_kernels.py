"""Per-row LoRA shrink/expand: the torch path against a row-by-row oracle, and Triton (through the CPU
interpreter) against the torch path."""

from __future__ import annotations

import pytest
import torch

import kernels
from kernels import reference_lora as ref

F32, F16 = torch.float32, torch.float16


def layout(seed: int, seg_rows: list[int], ranks: list[int]):
    """Random rows, stacks and per-segment adapter scales (some 0: sets lacking an adapter)."""
    g = torch.Generator().manual_seed(seed)
    T, R, K, N = sum(seg_rows), sum(ranks), 72, 40  # K, N, ranks: not multiples of the block sizes
    x = torch.randn(T, K, generator=g)
    a = torch.randn(K, R, generator=g) / K ** 0.5
    b = torch.randn(R, N, generator=g)
    adapter_scale = torch.randn(len(seg_rows), len(ranks), generator=g)
    seg, ad = torch.meshgrid(torch.arange(len(seg_rows)), torch.arange(len(ranks)), indexing="ij")
    adapter_scale[(seg + ad) % 3 == 1] = 0.0  # every set lacks some adapters, none lacks all
    adapter_scale[0] = 0.0  # a base-model segment: no adapter at all
    col_adapter = torch.repeat_interleave(torch.arange(len(ranks)), torch.tensor(ranks))
    return x, a, b, adapter_scale[:, col_adapter].contiguous()


def oracle(x, a, b, col_scale, seg_rows):
    """Row by row: each row's own adapters' columns only, in float64."""
    out = torch.zeros(x.shape[0], b.shape[1], dtype=torch.float64)
    seg_of_row = torch.repeat_interleave(torch.arange(len(seg_rows)), torch.tensor(seg_rows))
    for t in range(x.shape[0]):
        cs = col_scale[seg_of_row[t]].double()
        out[t] = ((x[t].double() @ a.double()) * cs) @ b.double()
    return out


@pytest.mark.parametrize("seg_rows", [[3, 1, 4, 0, 2], [1, 1, 1, 1, 1, 1, 1, 1], [0, 37, 5]])
def test_torch_path_gathers_each_rows_own_adapters(seg_rows):
    x, a, b, col_scale = layout(1, seg_rows, ranks=[4, 8, 16, 4])
    plan = kernels.lora_plan(col_scale, seg_rows)
    y0 = torch.randn(x.shape[0], b.shape[1])
    y = y0.clone()
    kernels.lora_expand(kernels.lora_shrink(x, a, plan), b, y, plan)
    torch.testing.assert_close((y - y0).double(), oracle(x, a, b, col_scale, seg_rows), rtol=1e-5, atol=1e-5)
    assert (y[: seg_rows[0]] == y0[: seg_rows[0]]).all()  # the base-model rows are untouched, bit for bit
    assert (y[seg_rows[0]:] != y0[seg_rows[0]:]).any(dim=1).float().mean() > 0.5  # the others mostly changed


def test_one_segment_plan_is_row_count_free_and_skips_unit_scales():
    x, a, b, col_scale = layout(2, [6], ranks=[8, 8])
    unit = kernels.lora_plan(torch.ones(1, 16))
    assert unit.mask is None and unit.seg_rows is None
    torch.testing.assert_close(kernels.lora_shrink(x, a, unit), x @ a, rtol=0, atol=0)
    scaled = kernels.lora_plan(col_scale)
    torch.testing.assert_close(kernels.lora_shrink(x[:2], a, scaled), (x[:2] @ a) * col_scale, rtol=0, atol=0)


def test_bad_plans_are_refused():
    with pytest.raises(ValueError, match="segments"):
        kernels.lora_plan(torch.ones(2, 4), [3])
    with pytest.raises(ValueError, match="one segment"):
        kernels.lora_plan(torch.ones(2, 4))
    plan = kernels.lora_plan(torch.ones(2, 4), [3, 1])
    with pytest.raises(ValueError, match="4 rows, x has 5"):
        kernels.lora_shrink(torch.ones(5, 8), torch.ones(8, 4), plan)
    with pytest.raises(ValueError, match="columns"):
        kernels.lora_shrink(torch.ones(4, 8), torch.ones(8, 5), plan)


# ---------------------------------------------------------------- Triton, through the interpreter

@pytest.fixture(scope="module")
def triton_lora():
    pytest.importorskip("triton")
    from kernels import triton_lora

    return triton_lora


@pytest.mark.parametrize("dtype", [F32, F16])
@pytest.mark.parametrize("seg_rows", [[3, 1, 4, 0, 2], [0, 37, 5], None])
def test_triton_shrink_expand_match_torch_path(triton_lora, dtype, seg_rows):
    x, a, b, col_scale = layout(3, seg_rows or [9], ranks=[4, 12, 16])
    if seg_rows is None:
        col_scale = col_scale.abs() + 0.5  # one segment (a LoRASet): every adapter in use
    x, a, b = x.to(dtype), a.to(dtype), b.to(dtype)
    plan = kernels.lora_plan(col_scale, seg_rows)
    s_ref = ref.lora_shrink(x, a, plan)
    s_tri = triton_lora.lora_shrink(x, a, plan)
    assert (s_ref != 0).any(dim=1).float().mean() > 0.5
    tol = {"atol": 1e-5, "rtol": 1e-5} if dtype == F32 else {"atol": 5e-3, "rtol": 5e-3}
    torch.testing.assert_close(s_tri, s_ref, **tol)
    # expand into a column slice of a wider output (how the model adds q, k and v into the fused qkv)
    wide = torch.randn(x.shape[0], 3 * b.shape[1]).to(dtype)
    want, got = wide.clone(), wide.clone()
    cols = slice(b.shape[1], 2 * b.shape[1])
    ref.lora_expand(s_ref[:, 4:], b[4:], want[:, cols], plan, col0=4)
    triton_lora.lora_expand(s_ref[:, 4:], b[4:], got[:, cols], plan, col0=4)
    torch.testing.assert_close(got, want, **({"atol": 1e-5, "rtol": 1e-5} if dtype == F32 else
                                             {"atol": 2e-2, "rtol": 5e-3}))
    assert torch.equal(got[:, : b.shape[1]], wide[:, : b.shape[1]])  # nothing outside the slice is written


def test_triton_skips_foreign_adapters_exactly(triton_lora):
    """Columns of an adapter no segment uses are never read: NaN weights there leave no trace."""
    x, a, b, _ = layout(4, [5, 20, 3], ranks=[16, 16, 16])
    col_scale = torch.zeros(3, 48)
    col_scale[1, :16] = 0.5  # segment 1: adapter 0; segment 2: adapters 0 and 2; segment 0: none
    col_scale[2, :16], col_scale[2, 32:] = 1.5, -2.0
    a[:, 16:32] = float("nan")  # adapter 1 (in the same column block as the others) is nobody's
    b[16:32] = float("nan")
    plan = kernels.lora_plan(col_scale, [5, 20, 3])
    s = triton_lora.lora_shrink(x, a, plan)
    assert not s.isnan().any() and (s[:, 16:32] == 0).all() and (s[:5] == 0).all() and (s[5:, :16] != 0).all()
    y = torch.zeros(x.shape[0], b.shape[1])
    triton_lora.lora_expand(s, b, y, plan)
    assert not y.isnan().any() and (y[:5] == 0).all() and (y[5:] != 0).all()
