"""The q6, q3k and q2k formats (GGUF Q6_K, Q3_K and Q2_K super-blocks kept as the file stores them, all multiplied
by kernels/cpu/q6.h, Q3_K and Q2_K through their layouts) against the float64 statement of their integer arithmetic on their
exact weights, row by row whatever the row count or thread split, on both builds (VNNI and AVX2), and against
what they replaced (re-quantized to q8) where parts must fuse."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize as gguf_dequantize

from engine.model.packing import repack
from engine.model.ggml_blocks import dequantize, q3_k_affine, q6_k_affine
from engine.model.qlinear import Q2KLinear, Q3KLinear, Q4Linear, Q6Linear, Q8Linear, cat_packed
from kernels import cpu_ext
from tests.kernels.test_cpu_kernels import _has_vnni, assert_rows_independent, run_on_isa_build, random_q4
from tests.kernels.q8k_oracle import fma32, q8_k
from tests.kernels.test_qgemm import _call
from tools.ggml_writers import quantize_q2_k, quantize_q3_k, quantize_q6_k

pytestmark = pytest.mark.skipif(not cpu_ext.available(), reason="pagedeck's CPU kernels did not build here")

# format -> (class, GGUF type, bytes a super-block, the codes' offset (Q2_K: minimums instead), the writer)
LAYOUTS = {"q6": (Q6Linear, Q.Q6_K, 210, 32, quantize_q6_k), "q3k": (Q3KLinear, Q.Q3_K, 110, 4, quantize_q3_k),
           "q2k": (Q2KLinear, Q.Q2_K, 84, 0, quantize_q2_k)}
FMTS = list(LAYOUTS)


def random_q6(N: int, K: int, seed: int = 0, source: str = "writer", fmt: str = "q6") -> Q6Linear | Q3KLinear:
    """From our plain writer, or random block bytes (every code, scale sign and magnitude) with finite d."""
    cls, _, nbytes, _, writer = LAYOUTS[fmt]
    g = torch.Generator().manual_seed(seed)
    if source == "writer":
        return cls(writer(torch.randn(N, K, generator=g) * 0.05).reshape(N, -1).clone())
    raw = torch.randint(0, 256, (N * K // 256, nbytes), generator=g, dtype=torch.uint8)
    for at in (nbytes - 4, nbytes - 2) if fmt == "q2k" else (nbytes - 2,):  # d (and Q2_K's d before its dmin)
        raw[:, at:at + 2] = (torch.rand(raw.shape[0], generator=g) * 1e-3).half().view(torch.uint8).view(-1, 2)
    return cls(raw.reshape(N, -1))


def _scales_and_d(fmt: str, blocks: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """Each super-block's sixteen integer scales (nb, 16) and its d (nb,), read from the bytes as ggml states
    them: Q6_K's int8 at 192, Q3_K's 6-bit values less 32 (low nibbles of bytes 0..7, then their high
    nibbles; the top two bits of scale h at 2 (h / 4) of byte 8 + h % 4)."""
    b = blocks.numpy()
    if fmt == "q2k":  # 4-bit scales (the low nibbles), d at 80
        return (b[:, 0:16] & 15).astype(np.int64), b[:, 80:82].copy().view(np.float16)[:, 0].astype(np.float32)
    if fmt == "q6":
        return b[:, 192:208].view(np.int8).astype(np.int64), b[:, 208:210].copy().view(np.float16)[:, 0].astype(np.float32)
    s = b[:, 96:108].astype(np.int64)
    low = np.concatenate([s[:, 0:8] & 15, s[:, 0:8] >> 4], axis=1)
    high = np.stack([(s[:, 8 + h % 4] >> (2 * (h // 4))) & 3 for h in range(16)], axis=1)
    return (low | high << 4) - 32, b[:, 108:110].copy().view(np.float16)[:, 0].astype(np.float32)


def reference_q6(x: torch.Tensor, w: Q6Linear | Q3KLinear) -> torch.Tensor:
    """llama.cpp's Q6_K (Q3_K, Q2_K) x Q8_K arithmetic in NumPy, to the bit: per super-block the exact integer
    I = sum_i sc_(i / 16) (q_i - offset) x_i (x the Q8_K activations), then acc = fma(I, d d_x, acc) in float32,
    super-block after super-block; Q2_K's codes 0..3 with no offset, and after each step its minimums' exact
    J = sum_h m_h hs_h (hs_h: the sum of x's h-th 16 codes) as acc = fma(-J, dmin d_x, acc)."""
    fmt = w.format
    q, dx, _ = q8_k(x)
    M, (N, K) = x.shape[0], w.shape
    blocks = w.row_blocks().reshape(-1, LAYOUTS[fmt][2])
    sc, d = _scales_and_d(fmt, blocks)
    sc, d = sc.reshape(N, K // 256, 16), d.reshape(N, K // 256)
    if fmt == "q2k":  # codes 0..3 of weight 128 n + 32 j + l: bits 2 j of byte 16 + 32 n + l
        pairs = blocks[:, 16:80].numpy().astype(np.int64).reshape(-1, 2, 1, 32) >> np.array([0, 2, 4, 6]).reshape(1, 1, 4, 1)
        codes = torch.from_numpy((pairs & 3).reshape(-1, 16, 16))
    else:
        codes, _ = (q6_k_affine if fmt == "q6" else q3_k_affine)(blocks)  # q - offset, (super-blocks, 16, 16)
    signed = codes.numpy().astype(np.int64).reshape(N, K // 256, 16, 16) * sc[..., None]
    I = np.einsum("mshi,nshi->mns", q.reshape(M, K // 256, 16, 16), signed).astype(np.float32)
    acc = np.zeros((M, N), np.float32)
    if fmt == "q2k":
        b = blocks.numpy()
        mins = (b[:, 0:16] >> 4).astype(np.int64).reshape(N, K // 256, 16)
        dmin = b[:, 82:84].copy().view(np.float16)[:, 0].astype(np.float32).reshape(N, K // 256)
        hs = q.reshape(M, K // 256, 16, 16).sum(-1)
        J = np.einsum("msh,nsh->mns", hs, mins).astype(np.float32)
    for s in range(K // 256):
        acc = fma32(I[..., s], (d[None, :, s] * dx[:, None, s]).astype(np.float32), acc)
        if fmt == "q2k":
            acc = fma32(-J[..., s], (dmin[None, :, s] * dx[:, None, s]).astype(np.float32), acc)
    return torch.from_numpy(acc)


@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("source", ["writer", "random bytes"])
@pytest.mark.parametrize("N,K,M", [(37, 768, 9), (8, 256, 1), (64, 4096, 5), (5, 512, 16)])
def test_q6_matmul_computes_its_stated_arithmetic(fmt, source, N, K, M):
    w = random_q6(N, K, N + K, source, fmt)
    x = torch.randn(M, K, generator=torch.Generator().manual_seed(M)) * 3
    x[0, 5] = 40.0  # an outlier channel
    if M > 4:
        x[4] = 0.0  # an all-zero row
    y = w(x)
    assert torch.equal(y, reference_q6(x, w))
    dense = F.linear(x, w.dequantize())  # per-256 activation scales: the outlier costs its super-block's codes
    assert ((y - dense).norm() / dense.norm()).item() < 5e-2


@pytest.mark.parametrize("fmt,bits", [("q6", 6.5625), ("q3k", 3.4375), ("q2k", 2.625)])
def test_q6_keeps_the_files_exact_weights_and_size(fmt, bits):
    _, qtype, nbytes, _, _ = LAYOUTS[fmt]
    w = random_q6(24, 512, 1, "random bytes", fmt)
    exact = dequantize(w.row_blocks(), qtype, (24, 512))
    assert np.array_equal(exact.numpy(), gguf_dequantize(w.row_blocks().numpy(), qtype))  # gguf's own decoder
    assert torch.equal(w.dequantize(), exact)
    ids = torch.tensor([3, 23, 3])
    assert torch.equal(w.embedding(ids), exact[ids])
    assert w.nbytes() == 24 * 512 // 256 * nbytes == repack.packed_nbytes(fmt, (24, 512))
    assert w.nbytes() * 8 / w.numel() == bits


def _extreme_blocks(fmt: str, N: int, K: int) -> torch.Tensor:
    """Every other row all top codes (63, Q3_K's 7, Q2_K's 3), the rest all code 0; scales at both ends (Q6_K's
    127 and -128 alternating; Q3_K's 31 on the top rows, -32 on the others; Q2_K's scales and minimums 15 and 0);
    d (and dmin) 1e-3."""
    nbytes = LAYOUTS[fmt][2]
    raw = torch.zeros(N * K // 256, nbytes, dtype=torch.uint8)
    if fmt == "q6":
        raw[0::2, :192] = 0xFF  # every code 63
        raw[:, 192:208] = torch.tensor([127, 128], dtype=torch.uint8).repeat(8)  # scales 127, -128 alternating
    elif fmt == "q3k":
        raw[0::2, :108] = 0xFF  # every code 7, every scale 63 - 32 = 31 (the others: code 0, scale -32)
    else:
        raw[0::2, :80] = 0xFF  # every code 3, every scale and minimum 15 (the others: 0)
        raw[:, 80:82] = torch.tensor([1e-3], dtype=torch.float16).view(torch.uint8)
    raw[:, nbytes - 2:] = torch.tensor([1e-3], dtype=torch.float16).view(torch.uint8)
    return raw


@pytest.mark.parametrize("fmt", FMTS)
def test_extreme_codes_scales_and_activations_sum_exactly(fmt):
    """Codes at both ends with scales at both ends against full-scale activations: the int16 pair sums of
    maddubs and the int32 products with the scales must not overflow."""
    N, K = 6, 512
    w = LAYOUTS[fmt][0](_extreme_blocks(fmt, N, K).reshape(N, -1))
    signs = torch.randn(2, K, generator=torch.Generator().manual_seed(0)).sign()
    x = torch.cat([torch.full((1, K), 2.0), torch.full((1, K), -2.0), signs * 3])
    # float32 accumulation errs ~1e-8 of sum |w x| (rows of mixed signs cancel, so a bound relative to the
    # result fails on ~6 % of sign draws); an overflowed int16 pair sum or int32 product errs by a large part of it
    scale = x.double().abs() @ w.dequantize().double().abs().T
    assert ((w(x).double() - reference_q6(x, w).double()).abs() <= 1e-6 * scale).all()
    assert torch.equal(_call(w, x, None, "1"), w(x))  # the GEMM path's panel of them too


@pytest.mark.parametrize("fmt", FMTS)
def test_a_rows_result_never_depends_on_the_other_rows(fmt):
    """Tiles of 4 activation rows, single rows, the GEMM path (from 8 rows) and thread splits give the same bits:
    batch invariance."""
    w = random_q6(70, 1024, 2, "writer", fmt)
    x = torch.randn(41, 1024)
    assert_rows_independent(w, x, (0, 5, 13, 40), (2, 9))


@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("N,K,M", [(40, 1024, 23), (5, 256, 16), (33, 768, 9)])  # a last panel of 8, 5, 1 columns
def test_gemm_path_gives_the_per_row_paths_bits(fmt, N, K, M):
    """Prompt rows (qgemm.h: the codes of a panel of 16 weight rows unpacked once, the halves of 16 summed
    apart) must give the per-row path's bits for every element."""
    w = random_q6(N, K, N * K, "random bytes", fmt)
    x = torch.randn(M, K, generator=torch.Generator().manual_seed(M)) * 3
    x[1, 7] = 40.0
    x[2] = 0.0
    gemm = _call(w, x, None, "1")
    assert torch.equal(gemm, _call(w, x, None, "1000000"))
    assert torch.equal(gemm, reference_q6(x, w))
    if N % 2 == 0:
        assert torch.equal(_call(w, x, "swiglu", "1"), _call(w, x, "swiglu", "1000000"))


@pytest.mark.parametrize("fmt", FMTS)
def test_swiglu_epilogue_is_silu_of_gate_times_up(fmt):
    w = random_q6(192, 512, 3, "writer", fmt)
    x = torch.randn(9, 512)
    gate, up = w(x).chunk(2, dim=-1)
    torch.testing.assert_close(w(x, "swiglu"), F.silu(gate) * up, rtol=1e-5, atol=1e-6)
    assert torch.equal(w(x[4:5], "swiglu"), w(x, "swiglu")[4:5])


def test_fused_parts_stay_q6_or_become_the_q8_they_were():
    """All-q6 parts stack as they are; beside q4 parts a q6 part becomes q8 with exactly the bits the loader
    gave Q6_K matrices before q6 existed (kernels/cpu/repack.cpp's q6_k_to_q8)."""
    a, b = random_q6(16, 512, 4), random_q6(8, 512, 5)
    both = cat_packed([a, b])
    assert isinstance(both, Q6Linear) and torch.equal(both.row_blocks(), torch.cat([a.row_blocks(), b.row_blocks()]))
    q4 = random_q4(16, 512, 6)
    mixed = cat_packed([q4, b])
    assert isinstance(mixed, Q8Linear)
    old = repack.from_blocks(b.row_blocks(), Q.Q6_K, (8, 512), "q8", keep_dense=False)
    assert torch.equal(mixed.qs[16:], old.qs) and torch.equal(mixed.scale[16:], old.scale)
    assert torch.equal(mixed.dense_rows(0, 16), Q8Linear.requantize(q4).dequantize())
    assert isinstance(q4, Q4Linear)


@pytest.mark.parametrize("fmt", FMTS)
def test_loader_keeps_the_files_blocks(fmt):
    cls, qtype, _, _, _ = LAYOUTS[fmt]
    w = random_q6(12, 768, 7, "writer", fmt)
    seen = []
    got = repack.from_blocks(w.row_blocks(), qtype, (12, 768), "packed", keep_dense=False,
                             done=lambda r0, r1: seen.append(r1))
    assert isinstance(got, cls) and torch.equal(got.row_blocks(), w.row_blocks()) and got.qs.data_ptr() != w.qs.data_ptr()
    assert seen[-1] == 12
    assert repack.kernel_format(qtype.name, "packed") == fmt and repack.kernel_format(qtype.name, "q8") == "q8"
    formats = repack.kernel_formats({"blk.0.attn_q.weight": "Q4_K", "blk.0.attn_k.weight": "Q4_K",
                                     "blk.0.attn_v.weight": qtype.name, "blk.0.ffn_down.weight": qtype.name}, "packed")
    assert formats == {"blk.0.attn_q.weight": "q8", "blk.0.attn_k.weight": "q8", "blk.0.attn_v.weight": "q8",
                       "blk.0.ffn_down.weight": fmt}


def test_a_q3_k_part_beside_others_keeps_its_format_or_becomes_q8_of_its_exact_weights():
    """A Q3_K_M file's q/k (Q3_K) beside its v (Q5_K or Q6_K): kept part by part where the kernels run
    (qlinear.PartsLinear), else q8 of each part's exact weights, as every type without a format once was."""
    q3, q6 = random_q6(16, 512, 9, "writer", "q3k"), random_q6(8, 512, 10)
    parts = cat_packed([q3, q6])
    assert [p.format for p in parts.parts] == ["q3k", "q6"]
    x = torch.randn(3, 512)
    assert torch.equal(parts(x), torch.cat([q3(x), q6(x)], dim=1))
    q3.dense = q3.dequantize()  # a part keeping dense prompt rows: the group becomes q8
    mixed = cat_packed([q3, random_q4(8, 512, 11)])
    assert isinstance(mixed, Q8Linear)
    old = repack.from_blocks(q3.row_blocks(), Q.Q3_K, (16, 512), "q8", keep_dense=False)
    assert torch.equal(mixed.qs[:16], old.qs) and torch.equal(mixed.scale[:16], old.scale)


@pytest.mark.skipif(not _has_vnni(), reason="no VNNI here: the default build is the AVX2 path, tested above")
def test_the_avx2_build_gives_the_same_bits():
    """The AVX2-only build (PAGEDECK_CPU_ISA=avx2) runs this file too, and its results equal this build's."""
    w, w3 = random_q6(40, 1024, 8), random_q6(40, 1024, 8, "random bytes", "q3k")
    x = torch.randn(6, 1024, generator=torch.Generator().manual_seed(1))
    check = ("from engine.model.qlinear import Q3KLinear, Q6Linear; "
             "assert torch.equal(Q6Linear(d['qs'])(d['x']), d['y']); assert torch.equal(Q3KLinear(d['q3'])(d['x']), d['y3'])")
    run_on_isa_build({"qs": w.row_blocks(), "q3": w3.row_blocks(), "x": x, "y": w(x), "y3": w3(x)}, check, [__file__],
                     "not avx2_build")


@pytest.mark.parametrize("recipe,qtype,fmt,beside", [("Q3_K_M", "Q3_K", "q3k", "Q4_K"), ("Q2_K", "Q2_K", "q2k", "Q3_K")])
def test_low_bit_files_keep_their_types_and_give_llama_cpps_logits(tmp_path, monkeypatch, recipe, qtype, fmt, beside):
    """llama.cpp's own Q3_K_M and Q2_K of a model (its quantizer and per-layer recipe: Q3_K beside Q4_K/Q5_K
    attn_v, ffn_down and o; Q2_K beside Q3_K and a Q6_K head), read packed: their Q3_K and Q2_K matrices are q3k and q2k,
    the weights (no dense prompt copies) no bigger than the file, and the logits within the quantized fidelity
    bounds against llama.cpp's (tests/engine/test_fidelity_llamacpp)."""
    pytest.importorskip("llama_cpp")
    from engine import Model
    from tests.engine.test_fidelity_llamacpp import check
    from tests.llamacpp_fidelity import build
    from tests.oracles.llamacpp_peer import run_jobs
    from tools.models._llamacpp_quantized import quantize, tensor_types

    files = build(tmp_path, [("llama", "F32")])  # F32: the kl_ref bound
    mixed = quantize(files.paths["llama", "F32"], tmp_path / f"llama-{recipe}.gguf", recipe)
    assert {qtype, beside} <= set(tensor_types(mixed).values())
    out = mixed.with_suffix(".npy")
    (result,) = run_jobs([{"op": "logits", "model": str(mixed), "ids": files.ids, "out": str(out)}], tmp_path)
    files.paths["llama", recipe], files.peer["llama", recipe] = mixed, {**result, "out": str(out)}
    check(files, ("llama", recipe), "packed")
    monkeypatch.setenv("PAGEDECK_DENSE_COPY", "0")
    model = Model.load(mixed, weights="packed")
    kept = {p.format for layer in model.layers for m in (layer.qkv, layer.o, layer.gate_up, layer.down)
            for p in getattr(m, "parts", [m])}
    assert fmt in kept and "q8" not in kept, kept  # no part re-quantized
    assert model.memory_bytes() <= mixed.stat().st_size
