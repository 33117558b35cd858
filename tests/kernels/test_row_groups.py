"""Q4_K rows regrouped 16 at a time (q4k16, kernels/cpu/q4k16.h): their bytes are the file's rows rearranged
as the header states (a NumPy statement of the layout) and go back to the same rows; their products are q4k's
own on the same rows bit for bit (per-row path for 1-7 activation rows, GEMM path, SwiGLU), hence llama.cpp's
arithmetic (test_q4k.py checks q4k against it); a row's result never depends on the batch or the thread count;
a grouped matrix decodes, gathers, converts and stacks the same weights as its rows. (Q6_K's groups:
test_q6_groups.py.)"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q

from engine.model.packing import repack_fast
from engine.model.qlinear import Q4KLinear, cat_packed
from kernels import cpu_ext, formats
from kernels.packed import NO_SCALES, group_superblocks, superblock_rows
from tests.kernels.test_cpu_kernels import assert_rows_independent
from tests.kernels.test_q4k import gguf_weights, random_q4k, reference_q4k
from tests.kernels.test_qgemm import _call

pytestmark = pytest.mark.skipif(not cpu_ext.available(), reason="pagedeck's CPU kernels did not build here")

# the layout's fields in order: (first byte of the row's super-block, bytes, unit): units of `unit` bytes,
# interleaved across the 16 rows
FIELDS = [(0, 2, 2), (2, 2, 2), (4, 12, 4), (16, 128, 4)]


def rows_product(rows: torch.Tensor, x: torch.Tensor, act: int = 0) -> torch.Tensor:
    """q4k's kernel on the file's rows (what the groups must reproduce)."""
    return cpu_ext.ops().qmatmul(x, rows, NO_SCALES, None, formats.Q4K.kernel_id, act)


def layout(rows: torch.Tensor) -> np.ndarray:
    """The groups as the header states them, built in NumPy: per group and super-block, field by field, unit j
    of rows 0..15, then unit j + 1 of rows 0..15..."""
    n, nsb = rows.shape[0], rows.shape[1] // 144
    b = rows.numpy().reshape(n // 16, 16, nsb, 144).transpose(0, 2, 1, 3)  # (group, super-block, row, byte)
    parts = [b[..., lo:lo + size].reshape(*b.shape[:3], size // unit, unit).transpose(0, 1, 3, 2, 4)
             for lo, size, unit in FIELDS]
    return np.concatenate([p.reshape(n // 16, nsb, -1) for p in parts], -1).reshape(n // 16, -1)


def test_groups_are_the_rows_bytes_as_stated_and_go_back():
    w = random_q4k(64, 768, 1, "random bytes")
    rows = w.row_blocks()
    groups = torch.empty(4, 3 * 2304, dtype=torch.uint8)
    group_superblocks(rows, groups, 144)
    assert np.array_equal(groups.numpy(), layout(rows)) and torch.equal(groups, w.qs)
    assert torch.equal(superblock_rows(groups, 144), rows)


@pytest.mark.parametrize("M", [1, 2, 3, 5, 7, 8, 13, 40])
@pytest.mark.parametrize("rows_from", ["1000000", "1"])  # the per-row path; the GEMM path for every M
def test_groups_give_the_rows_bits(M, rows_from):
    w = random_q4k(64, 1024, M, "random bytes")
    assert w.grouped and w.qs.shape == (4, 4 * 2304)
    rows = w.row_blocks()
    x = torch.randn(M, 1024, generator=torch.Generator().manual_seed(M)) * 2
    x[0, 3] = 50.0
    got = _call(w, x, None, rows_from)
    assert torch.equal(got, rows_product(rows, x))
    assert torch.equal(got, reference_q4k(x, w))
    assert torch.equal(_call(w, x, "swiglu", rows_from), rows_product(rows, x, 1))


def test_a_rows_result_never_depends_on_the_batch_or_the_threads():
    w = random_q4k(96, 512, 2)
    x = torch.randn(11, 512)
    assert_rows_independent(w, x, (0, 4, 10), (1, 4))


def test_grouped_weights_decode_gather_convert_and_stack_as_their_rows():
    w = random_q4k(64, 512, 3)
    assert w.grouped and not random_q4k(48, 512, 3).grouped  # 48 rows: SwiGLU's halves would split a group
    exact = gguf_weights(w)
    assert torch.equal(w.dense_rows(5, 37), exact[5:37])
    ids = torch.tensor([[47, 0, 16], [16, 3, 31]])
    assert torch.equal(w.embedding(ids), exact[ids])
    as_rows = repack_fast.pack(w.row_blocks(), Q.Q4_K, w.shape, "q4")
    q4 = w.to_q4()
    assert torch.equal(q4.qs, as_rows.qs) and torch.equal(q4.scale, as_rows.scale)
    other, odd = random_q4k(32, 512, 4), random_q4k(8, 512, 5)
    both = cat_packed([w, other])
    assert both.grouped and torch.equal(both.qs, torch.cat([w.qs, other.qs]))
    mixed = cat_packed([w, odd])  # 72 rows: not whole groups in each half, the rows
    assert not mixed.grouped and torch.equal(mixed.row_blocks(), torch.cat([w.row_blocks(), odd.row_blocks()]))
    x = torch.randn(3, 512)
    assert torch.equal(mixed(x), torch.cat([w(x), odd(x)], 1))


def test_bad_groups_are_refused_by_name():
    with pytest.raises(ValueError, match="q4k groups must be uint8"):
        Q4KLinear(torch.zeros(2, 1000, dtype=torch.uint8), grouped=True)
    with pytest.raises(RuntimeError, match="Q4_K .* super-blocks, not 18-byte"):
        group_superblocks(torch.zeros(16, 18, dtype=torch.uint8), torch.zeros(1, 288, dtype=torch.uint8), 18)
    rows = random_q4k(48, 256, 6).row_blocks()  # 48 rows as groups: SwiGLU's halves would split a group
    groups = Q4KLinear.empty_groups(48, 256)
    group_superblocks(rows, groups, 144)
    with pytest.raises(RuntimeError, match="bad activation"):
        Q4KLinear(groups, grouped=True)(torch.randn(1, 256), "swiglu")
