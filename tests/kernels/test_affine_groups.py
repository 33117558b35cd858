"""q4 and q5 rows regrouped 16 at a time (q4g and q5g, kernels/cpu/affine_groups.h): the groups hold the rows'
bytes as the header states (a NumPy statement of the layout) and go back to the same rows; their products are
the rows' own bit for bit for every row count (the group kernel and the GEMM from groups), with and without
SwiGLU, on both builds; groups of Q4_0 and Q5_0 rows (minimum -centre * scale) hold no minimums, Q5_0's give
the rows' bits and Q4_0's those of q8 rows of the same weights (its integer centring); a grouped matrix decodes and gathers the rows' weights; the loader groups the default model's q4
matrices and a Gemma-shaped file's q5 ones, and the logits keep their bits."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from gguf import GGMLQuantizationType as Q

from engine.model.qlinear import AffineLinear, PackedLinear, PartsLinear, Q4Linear, Q5Linear, Q8Linear
from kernels import cpu_ext, formats
from kernels.packed import native_group, pad_scales, q4_ungroup, q5_fields, q5_ungroup, unpack_nibbles
from tests.kernels.test_cpu_kernels import _has_vnni, assert_rows_independent, random_q4, run_on_isa_build
from tests.kernels.test_q5 import random_q5
from tests.kernels.test_q8g import assert_decodes_as_its_rows
from tests.kernels.test_qgemm import _call

pytestmark = [pytest.mark.skipif(not cpu_ext.available(), reason="pagedeck's CPU kernels did not build here"),
              pytest.mark.skipif(cpu_ext.available() and not native_group(formats.Q4.id(grouped=True)),
                                 reason="q4g's kernel is vectorized on AVX-512 VNNI builds only; elsewhere q4 stays "
                                        "in rows (the AVX2 build's bits are checked from a VNNI machine below)")]


def random_rows(fmt: str, N: int, K: int, seed: int = 0) -> AffineLinear:
    """q4 (Q4_1-like offsets), q5 (a Q5_1 matrix written by the gguf package, as the loader packs it), or their
    symmetric kin whose minimums are -centre * scale: q4_0 (Q4_0's m = -8 d) and q5_0 (a Q5_0 matrix)."""
    if fmt == "q4_0":
        w = random_q4(N, K, seed)
        return Q4Linear.from_packed(w.qs, w.scale, pad_scales((w.scale.float() * -8).half()))
    return random_q4(N, K, seed) if fmt == "q4" else random_q5(N, K, seed, Q.Q5_1 if fmt == "q5" else Q.Q5_0)[0]


FORMATS = ["q4", "q5", "q4_0", "q5_0"]


def q8_twin(codes: torch.Tensor, scale: torch.Tensor, centre: float) -> Q8Linear:
    """q8 rows of the weights scale * (codes - centre): what a group without minimums multiplies as."""
    return Q8Linear((codes.to(torch.int16) - int(centre)).to(torch.int8), scale, keep_dense=False)


def with_q8_twins(model) -> int:
    """Every grouped q4 matrix or part of `model` that holds no minimums (Q4_0's) replaced by its q8 twin (the
    all-layers decode's stack rebuilt over them): the model its logits must equal bit for bit. Returns how many."""
    swapped = 0
    for layer in model.layers:
        for name in ("qkv", "o", "gate_up", "down"):
            t = getattr(layer, name)
            parts = t.parts if isinstance(t, PartsLinear) else [t]
            for i, p in enumerate(parts):
                if isinstance(p, Q4Linear) and p.grouped and p.minimum is None:
                    qs, scale, _ = p.rows(0, p.shape[0])
                    twin = q8_twin(unpack_nibbles(qs), scale, p.centre)
                    parts[i] = twin
                    swapped += 1
                    if not isinstance(t, PartsLinear):
                        setattr(layer, name, twin)
    model.settled()
    return swapped


def oracle(w: AffineLinear) -> PackedLinear:
    """What a grouped copy of rows w must equal bit for bit: the rows themselves, or, for q4 rows whose every
    minimum is -8 * scale (Q4_0: groups without minimums, multiplied as q8), q8 rows of the same weights (codes
    q - 8). (Q5_0's groups keep the rows' bits: a model starts on Q5_0 rows and settles into groups.)"""
    n = w.shape[0]
    if not isinstance(w, Q4Linear) or not torch.equal(w.minimum[:n].float(), w.scale[:n].float() * -w.centre):
        return w
    return q8_twin(unpack_nibbles(w.qs), w.scale[:n], w.centre)


def grouped_copy(w: AffineLinear) -> AffineLinear:
    out = type(w).from_packed(w.qs.clone(), w.scale.clone(), w.minimum.clone())
    assert out.group()
    return out


@pytest.mark.parametrize("fmt", FORMATS)
def test_groups_of_q4_0_and_q5_0_leave_their_minimums_out(fmt):
    """A group whose minimums are all -centre * scale (GGUF Q4_0, Q5_0) holds none: a token reads the file's
    bytes (Q4_0: 18 a block, Q5_0: 22), and the kernel refuses q4 and q5 rows without them."""
    w = random_rows(fmt, 64, 640)
    g = grouped_copy(w)
    symmetric = fmt.endswith("_0")
    assert (g.minimum is None) == symmetric and (g.blocks[2] is None) == symmetric
    per_block = {"q4": 20, "q5": 24, "q4_0": 18, "q5_0": 22}[fmt]
    assert g.nbytes() == 64 * 20 * per_block
    for part, want in zip(g.rows(0, 64), (w.qs, w.scale[:64], w.minimum[:64])):
        assert torch.equal(part, want)
    if symmetric:
        with pytest.raises(RuntimeError, match="weights need minimums"):
            cpu_ext.ops().qmatmul(torch.randn(1, 640), w.qs, w.scale, None, w.kernel_id, 0)
        w.minimum[63, 19] = w.minimum[63, 19].float() * 1.01  # one block of the last row off -c d: kept, all of them
        assert grouped_copy(w).minimum is not None


def layout(w: AffineLinear) -> tuple[np.ndarray, ...]:
    """The groups as the header states them: per block the nibble words [word t][row][4 bytes], then (q5) each
    row's 4 bytes of fifth bits; scales and minimums [block][row]."""
    n, nb = w.shape[0], w.shape[1] // 32
    if isinstance(w, Q5Linear):
        nibbles, fifth = (t.numpy() for t in q5_fields(w.qs))
    else:
        nibbles, fifth = w.qs.numpy().reshape(n, nb, 16), np.zeros((n, nb, 0), np.uint8)
    words = nibbles.reshape(n // 16, 16, nb, 4, 4).transpose(0, 2, 3, 1, 4).reshape(n // 16, nb, -1)
    bits = fifth.reshape(n // 16, 16, nb, -1).transpose(0, 2, 1, 3).reshape(n // 16, nb, -1)
    codes = np.concatenate([words, bits], 2).reshape(n // 16, -1)
    by_block = [t.numpy().reshape(n // 16, 16, nb).transpose(0, 2, 1).reshape(n // 16, -1) for t in (w.scale, w.minimum)]
    return codes, *by_block


@pytest.mark.parametrize("fmt,block", [("q4", 256), ("q5", 320)])
def test_groups_are_the_rows_bytes_as_stated_and_go_back(fmt, block):
    w = random_rows(fmt, 64, 640)
    g = grouped_copy(w)
    codes, scales, minimums = layout(w)
    assert g.qs.shape == (4, 20 * block) and g.scale.shape == (4, 20 * 16) and g.minimum.shape == (4, 20 * 16)
    assert np.array_equal(g.qs.numpy(), codes)
    assert np.array_equal(g.scale.numpy(), scales) and np.array_equal(g.minimum.numpy(), minimums)
    for a, b in zip((q4_ungroup if fmt == "q4" else q5_ungroup)(g.qs, g.scale, g.minimum), (w.qs, w.scale, w.minimum)):
        assert torch.equal(a, b)


# K: 32 (one block), 544 (17 blocks: the lanes' last pass is short), 576 (the default model's), 2048
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("K", [32, 544, 576, 2048])  # 544: q5's odd last block, stored apart in rows
@pytest.mark.parametrize("M", [1, 2, 3, 4, 5, 8, 9, 16, 23, 24, 33])  # the group kernel below 24 rows, the GEMM from 24
def test_groups_give_the_rows_bits(M, K, fmt):
    w = oracle(random_rows(fmt, 96, K, M + K))
    g = grouped_copy(random_rows(fmt, 96, K, M + K))
    x = torch.randn(M, K, generator=torch.Generator().manual_seed(M)) * 2
    x[0, 3] = 50.0  # an outlier channel
    if M > 2:
        x[2] = 0.0  # an all-zero row (zero block scales)
    for rows_from in ("1000000", "1"):  # the rows' per-row path and their GEMM path
        assert torch.equal(g(x), _call(w, x, None, rows_from))
        assert torch.equal(g(x, "swiglu"), _call(w, x, "swiglu", rows_from))
    for rows_from in ("1000000", "1"):  # and the groups' own two paths
        assert torch.equal(_call(g, x, None, rows_from), g(x))


@pytest.mark.parametrize("centred", [True, False])  # Q4_0 / Q5_0 (no minimums kept) or Q4_1 / Q5_1
@pytest.mark.parametrize("cls,top", [(Q4Linear, 15), (Q5Linear, 31)])
def test_extreme_codes_and_activations_keep_the_rows_bits(cls, top, centred):
    """The largest codes and 0 against activations at +-127 after rounding: the int32 sums at their largest."""
    N, K = 32, 2048
    codes = torch.full((N, K), top, dtype=torch.uint8)
    codes[::2, ::3] = 0
    scale = torch.full((N, K // 32), 0.5, dtype=torch.float16)
    w = cls(codes, scale, (-(top + 1) // 2 * scale.float() + (0 if centred else 0.25)).half(), keep_dense=False)
    g, w = grouped_copy(w), oracle(w)
    x = torch.full((3, K), 1.0)
    x[1] = -1.0
    x[2, ::2] = -1.0
    assert torch.equal(g(x), w(x)) and torch.equal(g(x[1:2]), w(x[1:2]))


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_rows_result_never_depends_on_the_batch_or_the_threads(fmt):
    g = grouped_copy(random_rows(fmt, 160, 576, 3))
    assert_rows_independent(g, torch.randn(11, 576), (0, 4, 10), (1, 4))


@pytest.mark.parametrize("fmt", FORMATS)
def test_grouped_weights_decode_and_gather_as_their_rows(fmt):
    w = random_rows(fmt, 64, 288, 5)  # 9 blocks: q5's odd last block
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


def test_a_gemma_shaped_files_q5_matrices_load_grouped_and_the_logits_keep_their_bits(tmp_path, monkeypatch):
    """Gemma 3's Q4_K_M recipe keeps q, k, gate and up in Q5_0 (q5), v in Q8_0 in some layers (q|k|v then held in
    parts): every q5 matrix and part is grouped at load, without minimums (Q5_0's are -16 d), and every logit
    equals the rows'."""
    from engine import Model
    from tools.logits import forward_tokens
    from tools.models.synthetic_gguf import write_random_gguf

    monkeypatch.setenv("PAGEDECK_DENSE_COPY", "0")
    path = write_random_gguf(tmp_path / "g.gguf", "gemma3-270m", 2, "Q4_K_M", tied=True)
    grouped = Model.load(path, weights="packed", check_memory=False)
    assert grouped.wait_settled(60)
    monkeypatch.setenv("PAGEDECK_ROW_GROUPS", "0")
    rows = Model.load(path, weights="packed", check_memory=False)
    assert rows.wait_settled(60)

    def q5(model):
        mats = [t for layer in model.layers for t in (layer.qkv, layer.o, layer.gate_up, layer.down)]
        return [p for t in mats for p in (t.parts if isinstance(t, PartsLinear) else [t]) if isinstance(p, Q5Linear)]

    assert q5(grouped) and all(p.grouped and p.minimum is None for p in q5(grouped))
    assert not any(p.grouped for p in q5(rows))
    assert_twins_logits(grouped, rows)


def assert_twins_logits(grouped, rows) -> None:
    """grouped's logits (prompt and decode rows) equal those of its Q4_0 groups swapped for their q8 twins bit
    for bit, and the rows' bit for bit where it has none (Q5_0), else within float rounding (the rows centre
    their products in floats)."""
    from tools.logits import forward_tokens

    ids = torch.randint(20, 2000, (1, 12), generator=torch.Generator().manual_seed(0))
    want = [forward_tokens(grouped, ids), forward_tokens(grouped, ids, prompt=False)]
    twins = with_q8_twins(grouped)
    assert torch.equal(forward_tokens(grouped, ids), want[0])
    assert torch.equal(forward_tokens(grouped, ids, prompt=False), want[1])
    rows_logits = [forward_tokens(rows, ids), forward_tokens(rows, ids, prompt=False)]
    for got, ref in zip(want, rows_logits):
        if twins:
            torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-4)
        else:
            assert torch.equal(got, ref)


@pytest.mark.parametrize("quant", ["Q4_0", "Q5_0"])
def test_a_q4_0_or_q5_0_files_groups_hold_no_minimums_and_the_estimate_knows(tmp_path, monkeypatch, quant):
    """Every decoder matrix of a Q4_0 (Q5_0) file loads grouped without minimums: the weights hold 2 bytes a
    block fewer than in rows, the memory estimate says so byte for byte, and the logits are the q8 twins' (the
    rows')."""
    from engine import Model
    from engine.model.catalog import memory
    from tools.logits import forward_tokens
    from tools.models.synthetic_gguf import write_random_gguf

    monkeypatch.setenv("PAGEDECK_DENSE_COPY", "0")
    path = write_random_gguf(tmp_path / "m.gguf", "tiny", 2, quant)
    loaded = {}
    for groups in ("1", "0"):
        monkeypatch.setenv("PAGEDECK_ROW_GROUPS", groups)
        model = Model.load(path, weights="packed", check_memory=False)
        assert model.wait_settled(60)
        assert memory.estimate_memory(path, weights="packed").weights_bytes == model.memory_bytes()
        loaded[groups] = model
    mats = [t for layer in loaded["1"].layers for t in (layer.qkv, layer.o, layer.gate_up, layer.down)]
    assert all(isinstance(t, AffineLinear) and t.grouped and t.minimum is None for t in mats)
    minimums = sum(t.numel() // 32 * 2 + 16 for t in mats)  # each matrix's buffer: 2 bytes a block, SCALE_PAD
    assert loaded["0"].memory_bytes() - loaded["1"].memory_bytes() == minimums
    assert_twins_logits(loaded["1"], loaded["0"])


@pytest.mark.skipif(not _has_vnni(), reason="no VNNI here: the default build is the AVX2 path")
def test_prompt_decoders_give_the_weights_on_both_builds():
    """What a prompt chunk of a model without an fp32 copy multiplies: rows and groups (q4, q5, Q4_0's and
    Q5_0's without minimums) decoded by the C++ decoders, vectorized per block, equal the weights torch's decode
    of the rows gives, on this build and on the AVX2 one (its own vector form)."""
    saved, ops = {}, cpu_ext.ops()
    for fmt in FORMATS:
        w = random_rows(fmt, 64, 544, 9)  # 17 blocks: q5's odd last block, stored apart in rows
        g, want = grouped_copy(w), w.dense_rows(0, 64)
        for name, t in (("rows", w), ("groups", g)):
            out = torch.full((64, 544), float("nan"))
            t.dense_into(0, 64, out)
            assert torch.equal(out, want), (fmt, name)
        m = g.minimum if g.minimum is not None else torch.empty(0, dtype=torch.float16)
        saved |= {f"{fmt}_rows": (w.qs, w.scale[:64], w.minimum[:64]), f"{fmt}_groups": (g.qs, g.scale, m),
                  f"{fmt}_want": want}
    check = ("from kernels import cpu_ext; ops = cpu_ext.ops()\n"
             "for n in ('q4', 'q5', 'q4_0', 'q5_0'):\n"
             "    five = n.startswith('q5')\n"
             "    out = torch.empty(64, 544)\n"
             "    (ops.q5_dequantize_into if five else ops.q4_dequantize_into)(*d[n + '_rows'], out)\n"
             "    assert torch.equal(out, d[n + '_want']), n\n"
             "    out = torch.empty(64, 544)\n"
             "    (ops.q5g_dequantize_into if five else ops.q4g_dequantize_into)(*d[n + '_groups'], 0, 64, out)\n"
             "    assert torch.equal(out, d[n + '_want']), n")
    run_on_isa_build(saved, check, ["tests/kernels/test_cpu_kernels.py"], "never_depends")


@pytest.mark.skipif(not _has_vnni(), reason="no VNNI here: the default build is the AVX2 path")
def test_the_avx2_build_gives_the_same_bits():
    """The AVX2-only build keeps q4 and q5 in rows at load, but groups given to it are multiplied by the
    statement's lane-by-lane form (affine_groups.h's group_rows_portable) and the panels from groups: the same
    bits as this build's."""
    saved, x = {}, torch.randn(30, 544, generator=torch.Generator().manual_seed(1))
    for fmt in FORMATS:
        g = grouped_copy(random_rows(fmt, 64, 544, 8))
        m = g.minimum if g.minimum is not None else torch.empty(0, dtype=torch.float16)  # none: -centre * d
        saved |= {f"{fmt}_qs": g.qs, f"{fmt}_d": g.scale, f"{fmt}_m": m, f"{fmt}_y": g(x), f"{fmt}_y3": g(x[:3])}
    check = ("from kernels.packed import qmatmul; from kernels.formats import Q4, Q5\n"
             "for n, F in (('q4', Q4), ('q5', Q5), ('q4_0', Q4), ('q5_0', Q5)):\n"
             "    m = d[n + '_m'] if d[n + '_m'].numel() else None\n"
             "    w, f = (d[n + '_qs'], d[n + '_d'], m), F.id(grouped=True)\n"
             "    assert torch.equal(qmatmul(d['x'], w, f), d[n + '_y'])\n"
             "    assert torch.equal(qmatmul(d['x'][:3], w, f), d[n + '_y3'])")
    run_on_isa_build(saved | {"x": x}, check, ["tests/kernels/test_cpu_kernels.py"], "never_depends")
