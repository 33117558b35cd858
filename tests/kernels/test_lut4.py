"""The blocks-as-stored family (kernels/cpu/lut4.h): mxfp4 (GGUF MXFP4), iq4nl (IQ4_NL), iq4xs (IQ4_XS) and q8s
(Q8_0 as stored) hold the file's weights exactly (gguf-py's own decoders, every exponent and scale), the kernel
computes its stated arithmetic (table value or code times int8 activation, exact per block, times the block's
scale), the GEMM path gives the per-row path's bits, rows never depend on the batch, q8s gives q8's bits, and
the narrower builds (AVX2 only; AVX-512 without VBMI) give the same bits."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as Q
from gguf.quants import dequantize as gguf_dequantize
from gguf.quants import quantize as gguf_quantize

from engine.model.ggml_blocks import KVALUES_IQ4NL, KVALUES_MXFP4, e8m0_half, iq4_xs_scales
from engine.model.packing import experts, repack
from engine.model.qlinear import IQ4NLLinear, IQ4XSLinear, MXFP4Linear, PartsLinear, Q8Linear, Q8SLinear, cat_packed
from kernels import cpu_ext, formats
from tests.kernels.q8k_oracle import fma32, q8_k
from tests.kernels.test_cpu_kernels import (_has_vnni, assert_rows_independent, cpu_flags, quantized_activations,
                                             run_on_isa_build)
from tests.kernels.test_qgemm import _call
from tools.ggml_writers import quantize as quantize_ggml

pytestmark = pytest.mark.skipif(not cpu_ext.available(), reason="pagedeck's CPU kernels did not build here")

TYPES = {"mxfp4": Q.MXFP4, "iq4nl": Q.IQ4_NL, "iq4xs": Q.IQ4_XS, "q8s": Q.Q8_0}
CLASSES = {"mxfp4": MXFP4Linear, "iq4nl": IQ4NLLinear, "iq4xs": IQ4XSLinear, "q8s": Q8SLinear}
HELD = [f for f in TYPES if not formats.get(f).start_only]  # the formats a load keeps


def random_blocks(fmt: str, n: int, k: int, seed: int = 0, exponents: tuple[int, int] = (110, 135)) -> torch.Tensor:
    """(n, row bytes) of random block bytes (every code and sub-block scale) with scales in a finite range:
    MXFP4 exponent bytes in `exponents`, IQ4 and Q8_0 fp16 d of random signs and magnitudes around 1e-3."""
    g = torch.Generator().manual_seed(seed)
    values, nbytes = GGML_QUANT_SIZES[TYPES[fmt]]
    raw = torch.randint(0, 256, (n * k // values, nbytes), generator=g, dtype=torch.uint8)
    if fmt == "mxfp4":
        raw[:, 0] = torch.randint(exponents[0], exponents[1] + 1, (raw.shape[0],), generator=g, dtype=torch.uint8)
    else:
        d = (torch.randn(raw.shape[0], generator=g) * 1e-3).half()
        raw[:, 0:2] = d.view(torch.uint8).view(-1, 2)
    return raw.reshape(n, -1)


def from_writer(fmt: str, n: int, k: int, seed: int = 0) -> torch.Tensor:
    """Blocks of real weights: gguf-py's MXFP4 and Q8_0 quantizers, tools.ggml_writers' IQ4 ones."""
    w = torch.randn(n, k, generator=torch.Generator().manual_seed(seed)) * 0.05
    return torch.from_numpy(quantize_ggml(w, TYPES[fmt])).reshape(n, -1).clone()


def table_values_and_scales(w) -> tuple[torch.Tensor, torch.Tensor]:
    """(N, K/32, 32) table values of the codes and (N, K/32) block scales, read from the blocks as the format's
    definition says (not through the decoders under test)."""
    n, k = w.shape
    raw = w.row_blocks().reshape(-1, w.spec.code_bytes)
    if w.format == "q8s":  # no table: the int8 codes are the values
        codes, scales = raw[:, 2:].contiguous().view(torch.int8).double(), raw[:, 0:2].contiguous().view(torch.float16)
        return codes.view(n, k // 32, 32), scales.double().view(n, k // 32)
    if w.format == "iq4xs":
        nibbles, scales = raw[:, 8:].reshape(-1, 16), iq4_xs_scales(raw).reshape(-1)
    elif w.format == "iq4nl":
        nibbles, scales = raw[:, 2:], raw[:, 0:2].contiguous().view(torch.float16).float().reshape(-1)
    else:
        nibbles, scales = raw[:, 1:], e8m0_half(raw[:, 0])
    table = torch.tensor(KVALUES_MXFP4 if w.format == "mxfp4" else KVALUES_IQ4NL, dtype=torch.float64)
    codes = torch.cat([nibbles & 15, nibbles >> 4], dim=1).long()
    return table[codes].view(n, k // 32, 32), scales.double().view(n, k // 32)


def reference(x: torch.Tensor, w) -> torch.Tensor:
    """What the kernel computes, in float64: per block the exact integer sum of table value times int8
    activation, times the block's scale d_w and the activations' d_x, summed over blocks; iq4xs:
    reference_iq4xs."""
    if w.format == "iq4xs":
        return reference_iq4xs(x, w).double()
    q, dx, _ = quantized_activations(x)
    v, dw = table_values_and_scales(w)
    return (torch.einsum("mjk,njk->mnj", q, v) * dw[None] * dx[:, None, :]).sum(-1)


def reference_iq4xs(x: torch.Tensor, w) -> torch.Tensor:
    """llama.cpp's IQ4_XS x Q8_K arithmetic in NumPy, to the bit: per super-block the exact integer
    I = sum_b (ls_b - 32) (v_b . x_b) (v the table values, x the Q8_K activations), then acc = fma(I, d d_x, acc)
    in float32, super-block after super-block."""
    q, dx, _ = q8_k(x)
    M, (N, K) = x.shape[0], w.shape
    raw = w.row_blocks().reshape(-1, 136)
    d = raw[:, 0:2].contiguous().view(torch.float16).numpy().astype(np.float32).reshape(N, K // 256)
    ls = (iq4_xs_scales(raw).numpy() / raw[:, 0:2].contiguous().view(torch.float16).float().numpy()).round()
    v, _ = table_values_and_scales(w)
    dots = np.einsum("msbi,nsbi->mnsb", q.reshape(M, K // 256, 8, 32), v.numpy().astype(np.int64).reshape(N, K // 256, 8, 32))
    I = (dots * ls.astype(np.int64).reshape(N, K // 256, 8)[None]).sum(-1).astype(np.float32)
    acc = np.zeros((M, N), np.float32)
    for s in range(K // 256):
        acc = fma32(I[..., s], (d[None, :, s] * dx[:, None, s]).astype(np.float32), acc)
    return torch.from_numpy(acc)


@pytest.mark.parametrize("fmt", list(TYPES))
def test_the_blocks_hold_the_files_exact_weights(fmt):
    """Every block decodes to gguf-py's own dequantize, bit for bit: all 256 MXFP4 exponents (2^-128 and 2^-127
    are fp32 subnormals, 255 overflows to inf as in gguf), IQ4 d of every magnitude fp16 has, every code."""
    qtype = TYPES[fmt]
    values, nbytes = GGML_QUANT_SIZES[qtype]
    k = 1024
    raw = random_blocks(fmt, 64, k, 1).reshape(-1, nbytes)
    if fmt == "mxfp4":
        raw[:256, 0] = torch.arange(256, dtype=torch.uint8)
    else:  # fp16 bit patterns of every exponent: subnormals, 65504, inf and nan among them
        every = torch.randint(0, 1 << 16, (raw.shape[0],), generator=torch.Generator().manual_seed(4),
                              dtype=torch.int32)  # nan and inf scales among rows 5 and 63
        raw[:, 0:2] = every.to(torch.int16).view(torch.uint8).view(-1, 2)
    w = CLASSES[fmt](raw.reshape(64, -1))
    with np.errstate(over="ignore", invalid="ignore"):
        expected = torch.from_numpy(gguf_dequantize(raw.numpy(), qtype).reshape(64, k).copy())
    assert_same_bits(w.dequantize(), expected)
    assert w.format == fmt and repack.decodes_exactly(qtype.name, fmt)
    assert w.spec is (formats.STARTS_ON[qtype.name] if w.spec.start_only else formats.holding(qtype.name))
    ids = torch.tensor([5, 63, 5])
    assert_same_bits(w.embedding(ids), expected[ids])


def assert_same_bits(got: torch.Tensor, expected: torch.Tensor) -> None:
    """Equal bits (-0.0 and inf too) where gguf's value is a number, and nan where it is nan: a nan's payload is
    whatever torch's product kept (its vector and scalar loops differ), not a property of the file's weights."""
    nan = expected.isnan()
    assert torch.equal(got.isnan(), nan)
    assert torch.equal(got.view(torch.int32)[~nan], expected.view(torch.int32)[~nan])


@pytest.mark.parametrize("fmt", list(TYPES))
def test_sizes_are_the_files(fmt):
    w = CLASSES[fmt](random_blocks(fmt, 24, 512, 2))
    bits = {"mxfp4": 4.25, "iq4nl": 4.5, "iq4xs": 4.25, "q8s": 8.5}[fmt]
    assert w.nbytes() * 8 / w.numel() == bits
    assert w.nbytes() == repack.packed_nbytes(fmt, (24, 512)) == experts.storage_bytes(fmt, (24, 512))
    assert experts.storage_bytes(fmt, (3, 24, 512)) == 3 * w.nbytes()


@pytest.mark.parametrize("source", ["writer", "random bytes"])
@pytest.mark.parametrize("fmt", list(TYPES))
@pytest.mark.parametrize("N,K,M", [(37, 768, 9), (8, 256, 1), (64, 4096, 5), (5, 512, 16)])
def test_matmul_computes_its_stated_arithmetic(fmt, source, N, K, M):
    qs = from_writer(fmt, N, K, N + K) if source == "writer" else random_blocks(fmt, N, K, N + K)
    w = CLASSES[fmt](qs)
    x = torch.randn(M, K, generator=torch.Generator().manual_seed(M)) * 3
    x[0, 5] = 40.0  # an outlier channel
    if M > 4:
        x[4] = 0.0  # an all-zero row
    y = w(x)
    expected = reference(x, w)
    torch.testing.assert_close(y.double(), expected, rtol=1e-5, atol=1e-5 * expected.abs().max().item())
    if fmt == "iq4xs":
        assert torch.equal(y, reference_iq4xs(x, w))
    dense = F.linear(x, w.dequantize())  # the file's weights, fp32 (iq4xs: activation scales per 256, so the
    assert ((y - dense).norm() / dense.norm()).item() < (5e-2 if fmt == "iq4xs" else 2e-2)  # outlier costs more)


@pytest.mark.parametrize("fmt", list(TYPES))
def test_extreme_codes_and_activations_sum_exactly(fmt):
    """The table's largest magnitudes (IQ4's -127 and 113, MXFP4's +-12, Q8_0's -128 and 127) against full-scale
    activations of one sign and of mixed signs: AVX2's maddubs pairs (|v| * sign(x, v)) and VNNI's u8 v + 128
    with 128 sum(x) taken out must stay exact."""
    N, K = 6, 512
    qs = random_blocks(fmt, N, K, 3)
    raw = qs.view(-1, formats.get(fmt).code_bytes)
    nib = {"mxfp4": slice(1, None), "iq4nl": slice(2, None), "iq4xs": slice(8, None), "q8s": slice(2, None)}[fmt]
    # codes 7 / 15 (+-12), 0 / 15 (-127, 113), or Q8_0's -128 / 127
    lo, hi = {"mxfp4": (0x77, 0xFF), "q8s": (0x80, 0x7F)}.get(fmt, (0x00, 0xFF))
    raw[0::2, nib] = lo
    raw[1::2, nib] = hi
    w = CLASSES[fmt](raw.reshape(N, -1))
    signs = torch.randn(2, K, generator=torch.Generator().manual_seed(0)).sign()
    x = torch.cat([torch.full((1, K), 2.0), torch.full((1, K), -2.0), signs * 3])
    scale = x.double().abs() @ w.dequantize().double().abs().T
    assert ((w(x).double() - reference(x, w)).abs() <= 1e-6 * scale).all()


@pytest.mark.parametrize("fmt", list(TYPES))
def test_a_rows_result_never_depends_on_the_other_rows(fmt):
    """Tiles of 4 activation rows, single rows, the GEMM path (from 8 rows) and thread splits give the same bits."""
    w = CLASSES[fmt](random_blocks(fmt, 70, 1024, 4))
    x = torch.randn(41, 1024, generator=torch.Generator().manual_seed(4))
    assert_rows_independent(w, x, (0, 5, 13, 40), (2, 9))


@pytest.mark.parametrize("fmt", list(TYPES))
@pytest.mark.parametrize("N,K,M", [(40, 1024, 23), (5, 256, 16), (33, 768, 9)])  # a last panel of 8, 5, 1 columns
def test_gemm_path_gives_the_per_row_paths_bits(fmt, N, K, M):
    """Prompt rows (q8's GEMM tiles over a panel of table values and fp32 block scales) give the per-row path's
    bits for every element, SwiGLU's epilogue too."""
    w = CLASSES[fmt](random_blocks(fmt, N, K, N * K))
    x = torch.randn(M, K, generator=torch.Generator().manual_seed(M)) * 3
    x[1, 7] = 40.0
    x[2] = 0.0
    gemm = _call(w, x, None, "1")
    assert torch.equal(gemm, _call(w, x, None, "1000000"))
    expected = reference(x, w)
    torch.testing.assert_close(gemm.double(), expected, rtol=1e-5, atol=1e-5 * expected.abs().max().item())
    if N % 2 == 0:
        swiglu = _call(w, x, "swiglu", "1")
        assert torch.equal(swiglu, _call(w, x, "swiglu", "1000000"))
        gate, up = gemm.chunk(2, dim=-1)
        torch.testing.assert_close(swiglu, F.silu(gate) * up, rtol=1e-5, atol=1e-6)


def test_the_kernel_refuses_blocks_of_another_format():
    ops, x = cpu_ext.ops(), torch.randn(2, 512)
    nl, xs = IQ4NLLinear(random_blocks("iq4nl", 4, 512)), IQ4XSLinear(random_blocks("iq4xs", 4, 512))
    with pytest.raises(RuntimeError, match="do not match their declared format mxfp4"):
        ops.qmatmul(x, *nl.blocks, formats.MXFP4.kernel_id, 0)
    with pytest.raises(RuntimeError, match="do not match their declared format iq4nl"):
        ops.qmatmul(x, *xs.blocks, formats.IQ4NL.kernel_id, 0)
    with pytest.raises(RuntimeError, match="iq4xs weights need K a multiple of 256"):
        ops.qmatmul(torch.randn(2, 96), xs.qs[:, :51], *xs.blocks[1:], formats.IQ4XS.kernel_id, 0)
    with pytest.raises(ValueError, match="iq4xs rows must be uint8 IQ4_XS blocks"):
        IQ4XSLinear(random_blocks("iq4nl", 4, 512))


@pytest.mark.parametrize("fmt", HELD)
def test_loader_keeps_the_files_blocks(fmt):
    """from_blocks (a 2-D matrix, or an expert stack one expert at a time) keeps the blocks as they are, in
    their own format: not re-quantized to q8, which took 8.5 bits a weight."""
    qtype = TYPES[fmt]
    qs = from_writer(fmt, 3 * 16, 512, 5)
    seen = []
    got = repack.from_blocks(qs[:16], qtype, (16, 512), "packed", keep_dense=False, done=lambda r0, r1: seen.append(r1))
    assert type(got) is CLASSES[fmt] and got.format == fmt and torch.equal(got.qs, qs[:16])
    assert got.qs.data_ptr() != qs.data_ptr() and seen[-1] == 16
    assert repack.kernel_format(qtype.name, "packed") == fmt and repack.kernel_format(qtype.name, "q8") == "q8"
    stack = experts.pack_stack(qs, qtype, (3, 16, 512), "packed", keep_dense=False)
    assert [type(e) for e in stack] == [CLASSES[fmt]] * 3
    assert all(torch.equal(e.qs, qs[16 * i:16 * (i + 1)]) for i, e in enumerate(stack))
    fused = cat_packed(stack[:2])  # gate|up of one format: stacked as they are
    assert type(fused) is CLASSES[fmt] and torch.equal(fused.row_blocks(), qs[:32])
    as_q8 = repack.from_blocks(qs[:16], qtype, (16, 512), "q8", keep_dense=False)
    assert isinstance(as_q8, Q8Linear) and got.nbytes() < 0.55 * as_q8.nbytes()


@pytest.mark.parametrize("N,K,M", [(64, 1024, 1), (48, 512, 5), (64, 1024, 23), (40, 768, 130)])
def test_q8s_gives_q8s_bits(N, K, M):
    """Q8_0's blocks read as stored (what a model starts on) give the bits of the same blocks moved into q8's
    layout (what it settles into: rows, or groups for an output head) for every row count, per-row and GEMM
    paths, SwiGLU's epilogue too, so a step's logits never change as the layers settle."""
    raw = torch.from_numpy(gguf_quantize(np.random.default_rng(N + M).standard_normal((N, K)).astype(np.float32) * 0.05,
                                         Q.Q8_0)).reshape(N, -1)
    stored = Q8SLinear(raw)
    moved = repack.from_blocks(raw, Q.Q8_0, (N, K), keep_dense=False)
    head = repack.from_blocks(raw, Q.Q8_0, (N, K), keep_dense=False)
    assert moved.format == "q8" and not moved.grouped and head.group() == (N % 32 == 0)
    x = torch.randn(M, K, generator=torch.Generator().manual_seed(M)) * 2
    x[0, 3] = 30.0
    for rows in ("1", "1000000"):
        want = _call(moved, x, None, rows)
        assert torch.equal(_call(stored, x, None, rows), want)
        assert torch.equal(_call(stored, x, "swiglu", rows), _call(moved, x, "swiglu", rows))
    assert torch.equal(stored(x), head(x))
    assert torch.equal(stored.embedding(torch.tensor([0, N - 1])), moved.embedding(torch.tensor([0, N - 1])))


def test_mixed_fused_parts_keep_their_formats():
    """An MXFP4 part beside a Q8_0 one (a fused group of two types) stays each in its own format where the kernels
    run, each multiplied by its own kernel."""
    a = MXFP4Linear(from_writer("mxfp4", 16, 512, 6))
    b = repack.from_blocks(torch.from_numpy(gguf_quantize(np.random.default_rng(0).standard_normal((8, 512)).astype(
        np.float32) * 0.05, Q.Q8_0)), Q.Q8_0, (8, 512), keep_dense=False)
    both = cat_packed([a, b])
    assert isinstance(both, PartsLinear) and [p.format for p in both.parts] == ["mxfp4", "q8"]
    x = torch.randn(3, 512)
    assert torch.equal(both(x), torch.cat([a(x), b(x)], dim=-1))


def _has_vbmi() -> bool:
    return "avx512vbmi" in cpu_flags()


@pytest.mark.skipif(not _has_vnni(), reason="no VNNI here: the default build is the AVX2 path, tested above")
@pytest.mark.parametrize("isa", [
    "avx2",
    # the 512-bit one-row path unpacks 17- and 18-byte blocks with VBMI's byte permutes where the CPU has them
    # and with 128-bit inserts where it has not: the second runs only in a build without VBMI
    pytest.param("avx512", marks=pytest.mark.skipif(not _has_vbmi(), reason="no VBMI here: the default build is it")),
])
def test_the_narrower_builds_give_the_same_bits(isa):
    """The AVX2-only build (PAGEDECK_CPU_ISA=avx2) and, on a VBMI machine, the AVX-512 build without VBMI
    (=avx512) run this file too, and their results equal this build's, the per-row and the GEMM path of each
    format."""
    saved = {}
    x = torch.randn(11, 1024, generator=torch.Generator().manual_seed(1))
    for fmt, cls in CLASSES.items():
        w = cls(random_blocks(fmt, 40, 1024, 8))
        saved[fmt] = w.qs
        saved[fmt + "_rows"] = _call(w, x, None, "1000000")
        saved[fmt + "_gemm"] = _call(w, x, None, "1")
    check = ("from engine.model.qlinear import LUT4_CLASSES as C; from kernels import cpu_ext\n"
             "for f, cls in C.items():\n"
             "    w = cls(d[f])\n"
             "    for rows, key in (('1000000', '_rows'), ('1', '_gemm')):\n"
             "        with cpu_ext.tuning(qgemm_rows=int(rows)):\n"
             "            assert torch.equal(w(d['x']), d[f + key]), (f, key)")
    saved["x"] = x
    run_on_isa_build(saved, check, [__file__], "not narrower_builds", isa)
