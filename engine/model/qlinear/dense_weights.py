"""Prompt rows through a packed matrix's exact dense weights: a kept fp32 copy, the matrix decoded just in time
into a reused scratch buffer (in slabs whose MKL sgemm gives the whole matrix's bits), or dense tiles."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from . import scratch

TILE_ROWS = 1024  # output rows per dense tile when no dense copy is kept
MIN_ROWS = 12  # MKL's sgemm gives a row the bits it gets in any longer call only from 12 rows (and at 8): fewer
# are padded with zero rows (1-7 and 9-11 rows differed from the same rows in a 300-row call, measured on
# shapes of 576-4096 x 576-1536; padded to 12 they matched), so a prompt row's result never depends on how many
# prompt rows its chunk has (a prefix found in the cache leaves a chunk of one row)


def dense_product(x: torch.Tensor, w, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x @ W.T with W's (a PackedLinear's) exact dense weights: the kept copy, else decoded just in time into a
    reused scratch buffer (`scratch`): the whole matrix where it fits, so F.linear sees the same operands as with
    a copy and gives the same bits; a wider matrix (the default model's 49152-row tied head) in slabs of rows aligned so
    that MKL's sgemm gives the whole matrix's bits too (slabs of 7281 rows did not at 1-7 rows; multiples of
    1024 did at 1-96 rows, measured; the tests compare the logits bit for bit). A call of fewer than MIN_ROWS
    rows is padded with zero rows to MIN_ROWS, once, before any slab."""
    m = x.shape[0]
    if m < MIN_ROWS:
        padded = x.new_zeros(MIN_ROWS, x.shape[1])
        padded[:m] = x
        return dense_product(padded, w, bias)[:m]
    if w.dense is not None:
        return F.linear(x, w.dense.to(x.dtype), bias)
    N, K = w.shape
    if w.jit_dense:
        step = scratch.MAX_WEIGHTS // K  # slabs start on multiples of 1024 rows (64 for very wide K): MKL's
        step = step // 1024 * 1024 if step >= 1024 else max(64, step // 64 * 64)  # sgemm then gives the whole
        buf = scratch.get(min(step, N) * K)  # matrix's bits
        if step >= N:
            weights = buf[: N * K].view(N, K)
            w.dense_into(0, N, weights)
            return F.linear(x, weights.to(x.dtype), bias)
        y = x.new_empty(x.shape[0], N)
        for r0 in range(0, N, step):
            r1 = min(r0 + step, N)
            weights = buf[: (r1 - r0) * K].view(r1 - r0, K)
            w.dense_into(r0, r1, weights)
            y[:, r0:r1] = F.linear(x, weights.to(x.dtype), None if bias is None else bias[r0:r1])
        return y
    y = x.new_empty(x.shape[0], N)
    for r0 in range(0, N, TILE_ROWS):
        r1 = min(r0 + TILE_ROWS, N)
        y[:, r0:r1] = F.linear(x, w.dense_rows(r0, r1).to(x.dtype), None if bias is None else bias[r0:r1])
    return y
