"""q4 rows regrouped 16 at a time (q4g, kernels/cpu/q4g.h): the groups hold the rows' bytes as the header states
(a NumPy statement of the layout) and go back to the same rows; their products are q4's own on the rows bit for
bit for every row count (the group kernel and the GEMM from groups), with and without SwiGLU, on both builds; a
grouped matrix decodes and gathers the rows' weights; the loader groups the default model's q4 matrices and its
logits keep their bits."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from engine.model.qlinear import Q4Linear
from kernels import cpu_ext, formats
from kernels.packed import native_group, q4_ungroup
from tests.kernels.test_cpu_kernels import _has_vnni, assert_rows_independent, random_q4, run_on_isa_build
from tests.kernels.test_q8g import assert_decodes_as_its_rows
from tests.kernels.test_qgemm import _call

pytestmark = [pytest.mark.skipif(not cpu_ext.available(), reason="pagedeck's CPU kernels did not build here"),
              pytest.mark.skipif(cpu_ext.available() and not native_group(formats.Q4.id(grouped=True)),
                                 reason="q4g's kernel is vectorized on AVX-512 VNNI builds only; elsewhere q4 stays "
                                        "in rows (the AVX2 build's bits are checked from a VNNI machine below)")]


def grouped_copy(w: Q4Linear) -> Q4Linear:
    out = Q4Linear.from_packed(w.qs.clone(), w.scale.clone(), w.minimum.clone())
    assert out.group()
    return out


def layout(qs: torch.Tensor, scale: torch.Tensor, minimum: torch.Tensor) -> tuple[np.ndarray, ...]:
    """The groups as the header states them: codes [group][block][word t][row][4 bytes], scales and minimums
    [group][block][row]."""
    n, half = qs.shape
    nb = half // 16
    codes = qs.numpy().reshape(n // 16, 16, nb, 4, 4).transpose(0, 2, 3, 1, 4).reshape(n // 16, -1)
    by_block = [t.numpy().reshape(n // 16, 16, nb).transpose(0, 2, 1).reshape(n // 16, -1) for t in (scale, minimum)]
    return codes, *by_block


def test_groups_are_the_rows_bytes_as_stated_and_go_back():
    w = random_q4(64, 640)
    g = grouped_copy(w)
    codes, scales, minimums = layout(w.qs, w.scale, w.minimum)
    assert g.qs.shape == (4, 20 * 256) and g.scale.shape == (4, 20 * 16) and g.minimum.shape == (4, 20 * 16)
    assert np.array_equal(g.qs.numpy(), codes)
    assert np.array_equal(g.scale.numpy(), scales) and np.array_equal(g.minimum.numpy(), minimums)
    for a, b in zip(q4_ungroup(g.qs, g.scale, g.minimum), (w.qs, w.scale, w.minimum)):
        assert torch.equal(a, b)


# K: 32 (one block), 544 (17 blocks: the lanes' last pass is short), 576 (the default model's), 2048
@pytest.mark.parametrize("K", [32, 544, 576, 2048])
@pytest.mark.parametrize("M", [1, 2, 3, 4, 5, 8, 9, 16, 23, 24, 33])  # the group kernel below 24 rows, the GEMM from 24
def test_groups_give_the_rows_bits(M, K):
    w = random_q4(96, K, M + K)
    g = grouped_copy(w)
    x = torch.randn(M, K, generator=torch.Generator().manual_seed(M)) * 2
    x[0, 3] = 50.0  # an outlier channel
    if M > 2:
        x[2] = 0.0  # an all-zero row (zero block scales)
    for rows_from in ("1000000", "1"):  # the rows' per-row path and their GEMM path
        assert torch.equal(g(x), _call(w, x, None, rows_from))
        assert torch.equal(g(x, "swiglu"), _call(w, x, "swiglu", rows_from))
    for rows_from in ("1000000", "1"):  # and the groups' own two paths
        assert torch.equal(_call(g, x, None, rows_from), g(x))


def test_extreme_codes_and_activations_keep_the_rows_bits():
    """Codes 0 and 15 against activations at +-127 after rounding: the int32 sums at their largest."""
    N, K = 32, 2048
    codes = torch.full((N, K), 15, dtype=torch.uint8)
    codes[::2, ::3] = 0
    scale = torch.full((N, K // 32), 0.5, dtype=torch.float16)
    w = Q4Linear(codes, scale, -8 * scale.float(), keep_dense=False)
    g = grouped_copy(w)
    x = torch.full((3, K), 1.0)
    x[1] = -1.0
    x[2, ::2] = -1.0
    assert torch.equal(g(x), w(x)) and torch.equal(g(x[1:2]), w(x[1:2]))


def test_a_rows_result_never_depends_on_the_batch_or_the_threads():
    g = grouped_copy(random_q4(160, 576, 3))
    assert_rows_independent(g, torch.randn(11, 576), (0, 4, 10), (1, 4))


def test_grouped_weights_decode_and_gather_as_their_rows():
    w = random_q4(64, 256, 5)
    assert_decodes_as_its_rows(grouped_copy(w), w)


def test_only_whole_groups_in_each_half_are_grouped():
    """48 rows: SwiGLU's halves (24 rows) would split a group; such a matrix keeps its rows. Groups of the wrong
    shape are refused, naming the format."""
    w = random_q4(48, 128)
    assert not w.group() and w.qs.shape == (48, 64)
    with pytest.raises(RuntimeError, match="q4 grouped scales and minimums"):
        cpu_ext.ops().qmatmul(torch.randn(1, 128), torch.zeros(3, 4 * 256, dtype=torch.uint8),
                              torch.zeros(3, 4 * 15, dtype=torch.float16), torch.zeros(3, 4 * 16, dtype=torch.float16),
                              formats.Q4.id(grouped=True), 0)


def test_the_default_model_loads_grouped_and_its_logits_keep_their_bits(monkeypatch):
    """The embedded SmolLM2 (Q4_1): its decoder layers' q4 matrices are grouped at load; every logit, decode rows
    (the group kernel) and prompt rows through the packed kernels (the GEMM from groups), equals the rows'
    (PAGEDECK_ROW_GROUPS=0)."""
    from engine import Model
    from engine.model.weights import default_model_path
    from tools.logits import forward_tokens

    monkeypatch.setenv("PAGEDECK_DENSE_COPY", "0")  # prompt rows through the packed kernels too
    grouped = Model.load(default_model_path(), weights="packed", check_memory=False)
    assert grouped.wait_settled(60)
    mats = [t for layer in grouped.layers for t in (layer.qkv, layer.o, layer.gate_up, layer.down)]
    assert all(isinstance(t, Q4Linear) and t.grouped for t in mats)
    monkeypatch.setenv("PAGEDECK_ROW_GROUPS", "0")
    rows = Model.load(default_model_path(), weights="packed", check_memory=False)
    assert rows.wait_settled(60) and not rows.layers[0].gate_up.grouped
    for n in (12, 40):
        ids = torch.randint(20, 40000, (1, n), generator=torch.Generator().manual_seed(n))
        assert torch.equal(forward_tokens(grouped, ids), forward_tokens(rows, ids))
        assert torch.equal(forward_tokens(grouped, ids, prompt=False), forward_tokens(rows, ids, prompt=False))


@pytest.mark.skipif(not _has_vnni(), reason="no VNNI here: the default build is the AVX2 path")
def test_the_avx2_build_gives_the_same_bits():
    """The AVX2-only build keeps q4 in rows at load, but groups given to it are multiplied by the statement's
    lane-by-lane form (q4g.h's group_rows_portable) and the panels from groups: the same bits as this build's."""
    g = grouped_copy(random_q4(64, 576, 8))
    x = torch.randn(30, 576, generator=torch.Generator().manual_seed(1))
    check = ("from kernels.packed import qmatmul; from kernels.formats import Q4; w = (d['qs'], d['d'], d['m']); "
             "f = Q4.id(grouped=True); "
             "assert torch.equal(qmatmul(d['x'], w, f), d['y']) and torch.equal(qmatmul(d['x'][:3], w, f), d['y3'])")
    run_on_isa_build({"qs": g.qs, "d": g.scale, "m": g.minimum, "x": x, "y": g(x), "y3": g(x[:3])}, check,
                     ["tests/kernels/test_cpu_kernels.py"], "never_depends")
