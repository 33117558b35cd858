"""Q6_K, Q5_K, IQ4_XS and Q3_K rows regrouped 16 at a time (q6k16, q5k16, iq4xs16 and q3k16, kernels/cpu/q6k16.h,
q5k16.h, iq4xs16.h and q3k16.h): their bytes are the file's rows rearranged as the headers state (a NumPy statement of each layout) and go
back to the same rows; their products are the rows' own bit for bit (the group kernel for any number of activation
rows, the GEMM path, SwiGLU), hence the rows' arithmetic (test_q6.py, test_q5k.py and test_lut4.py check it against
float64 references); the AVX2-only build, which runs a group's rows through the rows' tile, gives the same bits; the
loader groups them only where the group kernels are vectorized. (Q4_K's groups: test_row_groups.py.)"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from engine.model.qlinear import IQ4XSLinear, Q3KLinear, Q6Linear, SuperBlockLinear, cat_packed
from engine.model.qlinear.superblock import Q5KLinear
from kernels import cpu_ext, formats
from kernels.packed import NO_SCALES, group_superblocks, native_group, superblock_rows
from tests.kernels.test_cpu_kernels import _has_vnni, assert_rows_independent, cpu_flags, run_on_isa_build
from tests.kernels.test_lut4 import random_blocks
from tests.kernels.test_lut4 import reference as reference_lut4
from tests.kernels.test_q5k import random_q5k, reference_q5k
from tests.kernels.test_q6 import random_q6, reference_q6
from tests.kernels.test_qgemm import _call

pytestmark = pytest.mark.skipif(not cpu_ext.available(), reason="pagedeck's CPU kernels did not build here")



def _random_q6(n: int, k: int, seed: int, source: str = "writer") -> Q6Linear:
    return random_q6(n, k, seed, source)


def _random_q5k(n: int, k: int, seed: int, source: str = "writer") -> Q5KLinear:
    return random_q5k(n, k, seed)  # random fields (every code, fifth bit, scale and minimum)


def _random_q3k(n: int, k: int, seed: int, source: str = "writer") -> Q3KLinear:
    return random_q6(n, k, seed, source, "q3k")


def _random_iq4xs(n: int, k: int, seed: int, source: str = "writer") -> IQ4XSLinear:
    return IQ4XSLinear(random_blocks("iq4xs", n, k, seed))  # every code and sub-block scale, finite d


KINDS = {"q6": (Q6Linear, _random_q6, reference_q6), "q5k": (Q5KLinear, _random_q5k, reference_q5k),
         "iq4xs": (IQ4XSLinear, _random_iq4xs, reference_lut4), "q3k": (Q3KLinear, _random_q3k, reference_q6)}
# the layouts of the word-interleaved formats: (first byte, bytes, unit) per field of a row's block
FIELDS = {"q5k": [(0, 2, 2), (2, 2, 2), (4, 12, 4), (16, 32, 4), (48, 128, 4)],
          "iq4xs": [(0, 2, 2), (2, 2, 2), (4, 4, 4), (8, 128, 4)],
          "q3k": [(32, 64, 4), (0, 32, 4), (96, 12, 1), (108, 2, 2)]}


def grouped(w: SuperBlockLinear) -> SuperBlockLinear:
    """w's rows as groups, whatever this build would choose."""
    if w.grouped:
        return w
    groups = type(w).empty_groups(*w.shape)
    group_superblocks(w.qs, groups, w.BLOCK_BYTES)
    return type(w)(groups, grouped=True)


def in_rows(w: SuperBlockLinear) -> SuperBlockLinear:
    """w as rows, whatever this build would choose."""
    out = type(w)(w.row_blocks().clone())
    if out.grouped:
        out.qs, out.grouped = w.row_blocks().clone(), False
    return out


def layout_words(rows: torch.Tensor, kind: str) -> np.ndarray:
    """q5k16's, iq4xs16's and q3k16's groups as their headers state them: per group and super-block, field by field
    (q5k: d, dmin, the scale words, the fifth-bit words, the nibble words; iq4xs: d, the high scale bits, the low
    ones, the nibble words; q3k: the pair words, the hmask words, the scale bytes, d), unit j of rows 0..15, then
    unit j + 1 of rows 0..15..."""
    fields, size = FIELDS[kind], sum(f[1] for f in FIELDS[kind])
    n, nsb = rows.shape[0], rows.shape[1] // size
    b = rows.numpy().reshape(n // 16, 16, nsb, size).transpose(0, 2, 1, 3)  # (group, super-block, row, byte)
    parts = [b[..., lo:lo + size].reshape(*b.shape[:3], size // unit, unit).transpose(0, 1, 3, 2, 4)
             for lo, size, unit in fields]
    return np.concatenate([p.reshape(n // 16, nsb, -1) for p in parts], -1).reshape(n // 16, -1)


def layout(rows: torch.Tensor) -> np.ndarray:
    """The groups as the header states them, in NumPy: per group and super-block, 48 lines (half n, word w, part
    p: low nibbles 64n + 4w, low nibbles 64n + 32 + 4w, high pairs 128 + 32n + 4w) of the 16 rows' 4 bytes, then
    the 16 rows' d, then scale j of the 16 rows for j = 0..15."""
    n, nsb = rows.shape[0], rows.shape[1] // 210
    b = rows.numpy().reshape(n // 16, 16, nsb, 210).transpose(0, 2, 1, 3)  # (group, super-block, row, byte)
    lines = [b[..., start:start + 4] for h in range(2) for w in range(8)
             for start in (64 * h + 4 * w, 64 * h + 32 + 4 * w, 128 + 32 * h + 4 * w)]
    parts = [line.reshape(*b.shape[:2], 64) for line in lines]
    parts.append(b[..., 208:210].reshape(*b.shape[:2], 32))
    parts.append(b[..., 192:208].transpose(0, 1, 3, 2).reshape(*b.shape[:2], 256))
    return np.concatenate(parts, -1).reshape(n // 16, -1)


def rows_product(w: SuperBlockLinear, x: torch.Tensor, act: int = 0) -> torch.Tensor:
    """The rows' kernel on w's rows (what the groups must reproduce)."""
    return cpu_ext.ops().qmatmul(x, w.row_blocks(), NO_SCALES, None, w.spec.kernel_id, act)


@pytest.mark.parametrize("kind", KINDS)
def test_groups_are_the_rows_bytes_as_stated_and_go_back(kind):
    cls, random, _ = KINDS[kind]
    rows = in_rows(random(64, 768, 1, "random bytes")).qs
    groups = torch.empty(4, 3 * 16 * cls.BLOCK_BYTES, dtype=torch.uint8)
    group_superblocks(rows, groups, cls.BLOCK_BYTES)
    assert np.array_equal(groups.numpy(), layout(rows) if kind == "q6" else layout_words(rows, kind))
    assert torch.equal(superblock_rows(groups, cls.BLOCK_BYTES), rows)


@pytest.mark.parametrize("M", [1, 2, 3, 5, 8, 13, 40])
@pytest.mark.parametrize("rows_from", ["1000000", "1"])  # the group kernel for every M; the GEMM path for every M
@pytest.mark.parametrize("kind,source", [("q6", "writer"), ("q6", "random bytes"), ("q5k", "random fields"),
                                         ("iq4xs", "random blocks"), ("q3k", "writer"), ("q3k", "random bytes")])
def test_groups_give_the_rows_bits(M, rows_from, kind, source):
    cls, random, reference = KINDS[kind]
    w = grouped(random(64, 1024, M, source))
    assert w.grouped and w.qs.shape == (4, 4 * 16 * cls.BLOCK_BYTES) and w.kernel_id == cls.spec.grouped_id
    x = torch.randn(M, 1024, generator=torch.Generator().manual_seed(M)) * 2
    x[0, 3] = 50.0  # an outlier channel
    got = _call(w, x, None, rows_from)
    assert torch.equal(got, rows_product(w, x))
    torch.testing.assert_close(got.double(), reference(x, w).double(), rtol=1e-5, atol=1e-5)
    assert torch.equal(_call(w, x, "swiglu", rows_from), rows_product(w, x, 1))


@pytest.mark.parametrize("kind", KINDS)
def test_a_rows_result_never_depends_on_the_batch_or_the_threads(kind):
    w = grouped(KINDS[kind][1](96, 512, 2))
    assert_rows_independent(w, x := torch.randn(11, 512), (0, 4, 10), (1, 4))
    assert torch.equal(w(x), rows_product(w, x))


def test_grouped_weights_decode_gather_and_stack_as_their_rows():
    w = grouped(random_q6(64, 512, 3))
    rows = in_rows(w)
    assert torch.equal(w.dense_rows(5, 37), rows.dense_rows(5, 37))
    ids = torch.tensor([[47, 0, 16], [16, 3, 31]])
    assert torch.equal(w.embedding(ids), rows.embedding(ids))
    other = grouped(random_q6(32, 512, 4))
    both = cat_packed([w, other])
    assert both.grouped and torch.equal(both.qs, torch.cat([w.qs, other.qs]))
    odd = random_q6(8, 512, 5)  # 8 rows: not a whole group
    mixed = cat_packed([w, odd])
    assert torch.equal(mixed.row_blocks(), torch.cat([w.row_blocks(), odd.row_blocks()]))
    x = torch.randn(3, 512)
    assert torch.equal(mixed(x), torch.cat([w(x), odd(x)], 1))


@pytest.mark.parametrize("kind", KINDS)
def test_they_are_grouped_where_their_group_kernel_is_vectorized(kind):
    """AVX-512 VNNI builds group Q6_K, Q5_K, IQ4_XS and Q3_K (whole groups in each SwiGLU half); the others keep the rows,
    which their rows' tiles run faster than a group's rows one by one."""
    cls, random, _ = KINDS[kind]
    assert native_group(cls.spec.grouped_id) == _has_avx512_vnni()
    assert random(64, 512, 6).grouped == native_group(cls.spec.grouped_id)
    assert not random(48, 512, 6).grouped  # 48 rows: SwiGLU's halves would split a group


def test_bad_groups_are_refused_by_name():
    with pytest.raises(ValueError, match="q6 groups must be uint8"):
        Q6Linear(torch.zeros(2, 1000, dtype=torch.uint8), grouped=True)
    with pytest.raises(RuntimeError, match="110-byte.*136-byte.*144-byte.*176-byte.*210-byte.*not 18-byte"):
        group_superblocks(torch.zeros(16, 18, dtype=torch.uint8), torch.zeros(1, 288, dtype=torch.uint8), 18)


def _has_avx512_vnni() -> bool:
    return {"avx512f", "avx512bw", "avx512_vnni"} <= cpu_flags()


@pytest.mark.skipif(not _has_vnni(), reason="no VNNI here: the default build is the AVX2 path")
def test_the_avx2_build_gives_the_same_bits():
    """The AVX2-only build (PAGEDECK_CPU_ISA=avx2) runs a group's rows through the rows' tile and unpacks its
    GEMM panels through the rows' unpacker: the same bits as this build's group kernels, on both paths."""
    x = torch.randn(11, 1024, generator=torch.Generator().manual_seed(2))
    saved = {"x": x}
    for kind, (_, random, _) in KINDS.items():
        w = grouped(random(64, 1024, 9, "random bytes"))
        saved |= {kind: w.qs, kind + "rows": _call(w, x, None, "1000000"), kind + "gemm": _call(w, x, None, "1"),
                  kind + "swiglu": _call(w, x, "swiglu", "1000000")}
    check = ("from engine.model.qlinear import IQ4XSLinear, Q3KLinear, Q6Linear\n"
             "from engine.model.qlinear.superblock import Q5KLinear\n"
             "from kernels import cpu_ext\n"
             "for kind, cls in (('q6', Q6Linear), ('q5k', Q5KLinear), ('iq4xs', IQ4XSLinear), ('q3k', Q3KLinear)):\n"
             "    w = cls(d[kind], grouped=True)\n"
             "    for rows, key in (('1000000', 'rows'), ('1', 'gemm')):\n"
             "        with cpu_ext.tuning(qgemm_rows=int(rows)):\n"
             "            assert torch.equal(w(d['x']), d[kind + key]), (kind, key)\n"
             "    with cpu_ext.tuning(qgemm_rows=1000000):\n"
             "        assert torch.equal(w(d['x'], 'swiglu'), d[kind + 'swiglu']), kind")
    run_on_isa_build(saved, check, [__file__], "not avx2_build and not vectorized")
