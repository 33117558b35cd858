"""The CPU kernels' fused rotary + K/V write + attention (kernels/cpu/attention.cpp) on fp16 pools: the new K/V
rounded into their slots as torch's .to(float16) rounds them (to nearest even), the attention equal to the torch reference over
the same fp16 pools, a row's result independent of the other rows, of the thread count and of how its prompt
was cut into chunks, and pools of
other element types refused by name. (fp32 pools: tests/kernels/test_cpu_kernels.py.)"""
from __future__ import annotations

import pytest
import torch

import kernels
from kernels import cpu_ext
from tests.kernels.test_cpu_kernels import _has_vnni, fused_vs_reference, run_on_isa_build
from tests.kernels.test_oracle import PagedCase

pytestmark = pytest.mark.skipif(not cpu_ext.available(), reason="pagedeck's CPU kernels did not build here")

F16 = torch.float16


def inputs(seqs, Hq, Hkv, D, ps, seed, dtype=F16):
    """A case on shuffled pages (NaN in every unwritten slot), its q|k|v rows, positions, slots and plan."""
    case = PagedCase(seqs, Hq, Hkv, D, ps, dtype=dtype, seed=seed)
    g = torch.Generator().manual_seed(seed + 1)
    qkv = torch.randn(sum(ql for ql, _ in seqs), (Hq + 2 * Hkv) * D, generator=g)
    positions = torch.cat([torch.arange(kv - ql, kv) for ql, kv in seqs])
    slots = torch.cat([case.slots(b, kv - ql, kv, ps) for b, (ql, kv) in enumerate(seqs)])
    inv_freq = 1.0 / (10000 ** (torch.arange(0, D, 2).float() / D))
    plan = kernels.plan_step(positions, inv_freq, case.block_table, case.cu_q, case.kv, ps, fuse=True)
    return case, qkv, positions, slots, inv_freq, plan


@pytest.mark.parametrize("seqs,Hq,Hkv,D,ps", [
    ([(1, 1), (1, 37), (1, 300), (1, 1200)], 9, 3, 64, 16),  # the default model's heads: the register-blocked path
    ([(1, 2100), (1, 513), (1, 1000)], 9, 3, 64, 256),  # long rows split over slices, merged
    ([(5, 40), (1, 17), (3, 290), (16, 16)], 8, 2, 32, 16),  # D % 64 != 0: the generic path; verification rows
    ([(1, 33), (40, 600), (1, 70)], 6, 2, 64, 16),  # a long prefill chunk beside, over the same fp16 pools
])
def test_fp16_pools_give_the_reference_attention_over_the_same_pools(seqs, Hq, Hkv, D, ps):
    out, expected, (k_fused, v_fused), (k_ref, v_ref), _ = fused_vs_reference(seqs, Hq, Hkv, D, ps, len(seqs) + Hq, F16)
    assert k_fused.dtype == F16 and out.dtype == torch.float32 and not out.isnan().any()
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    for a, b in ((k_fused, k_ref), (v_fused, v_ref)):  # the same slots written, NaN everywhere else
        assert torch.equal(a.isnan(), b.isnan())
    assert torch.equal(v_fused.nan_to_num(), v_ref.nan_to_num())  # v as given, rounded alike: the same bits
    # k is rotated first (fused multiply-adds here, torch's ops there): an fp32 ulp apart may round to
    # neighbouring fp16 values, one fp16 ulp (2^-10 relative) at most
    torch.testing.assert_close(k_fused.nan_to_num(), k_ref.nan_to_num(), rtol=2**-10, atol=2**-24)


def test_fp16_rounding_is_to_nearest_even_at_the_ties():
    """Values halfway between two fp16 numbers (1 + 2^-11 and 1 + 3 * 2^-11) round to the even neighbour."""
    seqs, Hq, Hkv, D, ps = [(1, 5)], 2, 2, 64, 16
    case, qkv, positions, slots, inv_freq, plan = inputs(seqs, Hq, Hkv, D, ps, seed=3)
    ties = torch.tensor([1 + 2**-11, 1 + 3 * 2**-11, -(1 + 2**-11), 2048 + 1.0]).repeat(D // 4)
    qkv[:, (Hq + Hkv) * D :] = ties.repeat(Hkv)  # v is written as given (k is rotated first)
    v_pool = case.v_cache.clone()
    kernels.fused_attention(qkv, case.k_cache.clone(), v_pool, slots, case.block_table, case.cu_q, case.kv, Hq,
                            D ** -0.5, plan)
    written = v_pool.view(-1, Hkv, D)[slots[0]]
    assert torch.equal(written, ties.to(F16).expand(Hkv, D))
    assert written[0, :4].tolist() == [1.0, 1 + 2**-9, -1.0, 2048.0]


def test_a_rows_result_on_fp16_pools_depends_on_neither_the_batch_nor_the_threads():
    """Sequence 0 alone, beside two others (one long, so the work split differs), and on one thread: the same
    bits."""
    seqs, Hq, Hkv, D, ps = [(1, 700), (1, 37), (2, 1500)], 9, 3, 64, 16
    case, qkv, positions, slots, inv_freq, _ = inputs(seqs, Hq, Hkv, D, ps, seed=5)

    def run(n_seqs: int, rows: int) -> torch.Tensor:
        table, cu, kv = case.block_table[:n_seqs], case.cu_q[: n_seqs + 1], case.kv[:n_seqs]
        plan = kernels.plan_step(positions[:rows], inv_freq, table, cu, kv, ps, fuse=True)
        return kernels.fused_attention(qkv[:rows], case.k_cache.clone(), case.v_cache.clone(), slots[:rows], table,
                                       cu, kv, Hq, D ** -0.5, plan)

    together = run(3, 4)
    assert torch.equal(together[:1], run(1, 1))
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert torch.equal(run(3, 4), together)
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("cuts", [[16, 40, 44, 600], [1] * 4 + [696], [513, 187], [700]])
def test_a_rows_result_on_fp16_pools_does_not_depend_on_how_its_prompt_was_chunked(cuts):
    """A 700-token prompt prefilled whole, then in chunks of other sizes (as a preempted job recomputes its K/V):
    every row attends over the pools' rounded K/V, its own chunk's included, so each row gets the same bits."""
    seqs, Hq, Hkv, D, ps = [(700, 700)], 9, 3, 64, 16
    case, qkv, positions, slots, inv_freq, _ = inputs(seqs, Hq, Hkv, D, ps, seed=11)

    def prefill(chunks: list[int]) -> torch.Tensor:
        k_pool, v_pool, outs, start = case.k_cache.clone(), case.v_cache.clone(), [], 0
        for n in chunks:
            rows = slice(start, start + n)
            cu, kv = torch.tensor([0, n], dtype=torch.int32), torch.tensor([start + n], dtype=torch.int32)
            plan = kernels.plan_step(positions[rows], inv_freq, case.block_table, cu, kv, ps, fuse=True)
            outs.append(kernels.fused_attention(qkv[rows], k_pool, v_pool, slots[rows], case.block_table, cu, kv,
                                                Hq, D ** -0.5, plan))
            start += n
        return torch.cat(outs)

    assert torch.equal(prefill(cuts), prefill([700]))


@pytest.mark.parametrize("k_dtype,v_dtype", [(torch.bfloat16, torch.bfloat16), (F16, torch.float32)])
def test_pools_of_another_or_of_mixed_element_types_are_refused(k_dtype, v_dtype):
    case, qkv, positions, slots, inv_freq, plan = inputs([(1, 20)], 4, 2, 32, 16, seed=0, dtype=torch.float32)
    with pytest.raises(RuntimeError, match="both float32 or both float16"):
        kernels.fused_attention(qkv, case.k_cache.to(k_dtype), case.v_cache.to(v_dtype), slots, case.block_table,
                                case.cu_q, case.kv, 4, 0.1, plan)


def attention_bits() -> dict[str, torch.Tensor]:
    """This build's attention on every head group size the register-blocked path takes, D 64 and 128, fp16 and
    fp32 pools, decode rows and a 37-row chunk: what the AVX2-only build must give bit for bit."""
    return {f"{G}-{D}-{dtype}": fused_vs_reference([(1, 70), (37, 300), (3, 3)], 2 * G, 2, D, 16, seed=G + D,
                                                   dtype=dtype)[0]
            for G in range(1, 9) for D, dtype in ((64, F16), (128, torch.float32), (128, F16))}


@pytest.mark.skipif(not _has_vnni(), reason="no AVX-512 here: the default build is the AVX2 path, tested above")
def test_the_avx2_build_gives_the_same_bits():
    """The AVX2-only build runs this file too, and its attention equals this build's bit for bit (a row's bits
    are the same on every build, as every kernel's)."""
    check = ("from tests.kernels.test_attention_cpu import attention_bits\n"
             "for case, out in attention_bits().items(): assert torch.equal(out, d[case]), case")
    run_on_isa_build(attention_bits(), check, [__file__], "not avx2_build")


@pytest.mark.parametrize("dtype", [F16, torch.float32])
def test_one_position_far_above_the_rest_takes_the_whole_weight(dtype):
    """Every history key zero but one, whose score is 200 (the others 0): the softmax puts all its weight there,
    so each head's output is that position's V row, exactly. A running maximum that missed the position (at any
    offset within a chunk, a slice or a page) would weigh it wrongly (exp(200) is past fp32): not V."""
    L, Hq, Hkv, D, ps = 1100, 3, 1, 64, 256  # one KV head of three query heads: the register-blocked path
    case, qkv, positions, slots, _, _ = inputs([(1, L)], Hq, Hkv, D, ps, seed=11, dtype=dtype)
    history = case.slots(0, 0, L - 1, ps)
    c = (200.0 * D ** 0.5) ** 0.5  # q . k scale = c^2 D^-0.5 = 200
    qkv[:, : Hq * D] = 0.0
    qkv[:, 0 : Hq * D : D] = c  # every query head along dim 0
    qkv[:, Hq * D : (Hq + Hkv) * D] = 0.0  # the new position's key: score 0
    inv_freq = torch.zeros(D // 2)  # no rotation: the keys stay as written
    plan = kernels.plan_step(positions, inv_freq, case.block_table, case.cu_q, case.kv, ps, fuse=True)
    for top in (0, 7, 8, 15, 16, 17, 31, 63, 64, 100, 255, 256, 511, 512, 700, L - 2):
        k_pool, v_pool = case.k_cache.clone(), case.v_cache.clone()
        k_pool.view(-1, Hkv, D)[history] = 0.0
        k_pool.view(-1, Hkv, D)[history[top], 0, 0] = c
        out = kernels.fused_attention(qkv, k_pool, v_pool, slots, case.block_table, case.cu_q, case.kv, Hq,
                                      D ** -0.5, plan)
        expected = v_pool.view(-1, Hkv, D)[history[top], 0].float().repeat(Hq)
        assert torch.equal(out[0], expected), f"the position at {top}"
