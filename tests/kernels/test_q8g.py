"""q8 rows regrouped 16 at a time in the GEMM tiles' layout (q8g, kernels/cpu/q8.h): the groups hold the rows'
bytes as the header states (a NumPy statement of the layout) and go back to the same rows; their products are
q8's own on the rows bit for bit for every row count, with and without SwiGLU, on both builds; a grouped matrix
decodes and gathers the rows' weights; the loader groups a Q8_0 output head (tied to the embedding, as Gemma's
is) and the model's logits keep their bits."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from engine.model.qlinear import Q8Linear
from kernels import cpu_ext, formats
from kernels.packed import q8_dequantize, q8_ungroup
from tests.kernels.test_cpu_kernels import _has_vnni, assert_rows_independent, run_on_isa_build
from tests.kernels.test_qgemm import _call

pytestmark = pytest.mark.skipif(not cpu_ext.available(), reason="pagedeck's CPU kernels did not build here")


def random_q8(N: int, K: int, seed: int = 0) -> Q8Linear:
    g = torch.Generator().manual_seed(seed)
    return Q8Linear.quantize(torch.randn(N, K, generator=g) * (torch.rand(N, 1, generator=g) + 0.05), keep_dense=False)


def grouped_copy(w: Q8Linear) -> Q8Linear:
    out = Q8Linear.from_packed(w.qs.clone(), w.scale.clone())
    assert out.group()
    return out


def layout(qs: torch.Tensor, scale: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """The groups as the header states them: codes [group][block][step t][row][4 bytes], scales
    [group][block][row]."""
    n, k = qs.shape
    codes = qs.numpy().reshape(n // 16, 16, k // 32, 8, 4).transpose(0, 2, 3, 1, 4).reshape(n // 16, -1)
    return codes, scale.numpy().reshape(n // 16, 16, k // 32).transpose(0, 2, 1).reshape(n // 16, -1)


def test_groups_are_the_rows_bytes_as_stated_and_go_back():
    w = random_q8(64, 640)
    g = grouped_copy(w)
    codes, scales = layout(w.qs, w.scale)
    assert g.qs.shape == (4, 20 * 512) and g.scale.shape == (4, 20 * 16)
    assert np.array_equal(g.qs.numpy(), codes) and np.array_equal(g.scale.numpy(), scales)
    qs, scale = q8_ungroup(g.qs, g.scale)
    assert torch.equal(qs, w.qs) and torch.equal(scale, w.scale)


@pytest.mark.parametrize("K", [64, 640, 2048])  # 2048: K % 256 == 0, where the super-block formats are told apart
@pytest.mark.parametrize("M", [1, 2, 3, 4, 5, 8, 9, 16, 33])
def test_groups_give_the_rows_bits(M, K):
    w = random_q8(96, K, M)
    g = grouped_copy(w)
    x = torch.randn(M, K, generator=torch.Generator().manual_seed(M)) * 2
    x[0, 3] = 50.0
    for rows_from in ("1000000", "1"):  # the rows' per-row path and their GEMM path
        assert torch.equal(g(x), _call(w, x, None, rows_from))
        assert torch.equal(g(x, "swiglu"), _call(w, x, "swiglu", rows_from))


def test_a_rows_result_never_depends_on_the_batch_or_the_threads():
    g = grouped_copy(random_q8(160, 640, 3))
    assert_rows_independent(g, torch.randn(11, 640), (0, 4, 10), (1, 4))


def assert_decodes_as_its_rows(g, w) -> None:
    """Grouped matrix g decodes (whole, a range of rows across groups into a buffer and as a tensor, embedding
    rows) as w, the same rows ungrouped, and is refused by cat, naming its format."""
    assert torch.equal(g.dequantize(), w.dequantize())
    assert torch.equal(g.dense_rows(5, 37), w.dense_rows(5, 37))
    out = torch.empty(32, w.shape[1])
    g.dense_into(5, 37, out)
    assert torch.equal(out, w.dense_rows(5, 37))
    ids = torch.tensor([[0, 15, 16, 63], [31, 32, 17, 1]])
    assert torch.equal(g.embedding(ids), w.embedding(ids))
    with pytest.raises(ValueError, match=f"grouped {w.format}"):
        type(w).cat([g, w])


def test_grouped_weights_decode_and_gather_as_their_rows():
    w = random_q8(64, 256, 5)
    assert_decodes_as_its_rows(grouped_copy(w), w)


def test_only_whole_groups_in_each_half_are_grouped():
    """48 rows: SwiGLU's halves (24 rows) would split a group; such a matrix keeps its rows."""
    w = random_q8(48, 128)
    assert not w.group() and w.qs.shape == (48, 128)
    with pytest.raises(RuntimeError, match="q8 grouped scales must be"):
        cpu_ext.ops().qmatmul(torch.randn(1, 128), torch.zeros(3, 4 * 512, dtype=torch.uint8),
                              torch.zeros(3, 4 * 15, dtype=torch.float16), None, formats.Q8.id(grouped=True), 0)


def test_a_tied_q8_0_head_loads_grouped_and_the_logits_keep_their_bits(tmp_path, monkeypatch):
    """Gemma's layout: the Q8_0 token embedding is the output head. Without dense prompt rows (a model that big)
    the loader groups it; every logit, prompt and decode rows, equals the rows' (PAGEDECK_ROW_GROUPS=0)."""
    from engine import Model
    from tools.logits import forward_tokens
    from tools.models.synthetic_gguf import write_random_gguf

    monkeypatch.setenv("PAGEDECK_DENSE_COPY", "0")
    path = write_random_gguf(tmp_path / "g.gguf", "gemma3-270m", 1, "Q4_K_M", tied=True)
    grouped = Model.load(path, weights="packed", check_memory=False)
    assert grouped.wait_settled(60)  # it starts on the file's rows (q8s) and settles into groups
    assert isinstance(grouped.lm_head, Q8Linear) and grouped.lm_head.grouped and grouped.lm_head is grouped.embed
    monkeypatch.setenv("PAGEDECK_ROW_GROUPS", "0")
    rows = Model.load(path, weights="packed", check_memory=False)
    assert rows.wait_settled(60) and not rows.lm_head.grouped
    ids = torch.randint(20, 2000, (1, 12), generator=torch.Generator().manual_seed(0))
    assert torch.equal(forward_tokens(grouped, ids), forward_tokens(rows, ids))
    assert torch.equal(forward_tokens(grouped, ids, prompt=False), forward_tokens(rows, ids, prompt=False))
    qs, scale = grouped.lm_head.rows(0, grouped.lm_head.shape[0])
    assert torch.equal(q8_dequantize(qs[ids[0]], scale[ids[0]]), rows.lm_head.dense_rows(0, 2000)[ids[0]])


@pytest.mark.skipif(not _has_vnni(), reason="no VNNI here: the default build is the AVX2 path, tested above")
def test_the_avx2_build_gives_the_same_bits():
    """The AVX2-only build (PAGEDECK_CPU_ISA=avx2: the 256-bit tile, maddubs) runs this file too, and its
    products of groups equal this build's."""
    g = grouped_copy(random_q8(64, 640, 8))
    x = torch.randn(20, 640, generator=torch.Generator().manual_seed(1))
    check = ("from kernels.packed import qmatmul; from kernels.formats import Q8; w = (d['qs'], d['d'], None); "
             "f = Q8.id(grouped=True); "
             "assert torch.equal(qmatmul(d['x'], w, f), d['y']) and torch.equal(qmatmul(d['x'][:1], w, f), d['y1'])")
    run_on_isa_build({"qs": g.qs, "d": g.scale, "x": x, "y": g(x), "y1": g(x[:1])}, check, [__file__],
                      "not avx2_build and not tied")
