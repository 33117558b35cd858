"""The CPU kernels' fused attention (kernels/cpu/attention.cpp) with the layer options of the architectures beyond
Llama's: per-head q/k RMSNorm before the rotation (Qwen3, Gemma 3), rotation of the first dims only, the rotary
tables of another base or factor, a sliding window, soft-capped scores (Gemma 2) and sinks (gpt-oss). Each equals
the torch reference ops (rms_norm, apply_rotary, write_kv, paged_attention) on the same case, over fp32 and fp16
pools, and a row's bits still depend on neither its batch nor how its prompt was chunked."""
from __future__ import annotations

import pytest
import torch

import kernels
from kernels import cpu_ext
from kernels import reference as ref
from kernels.reference_attention import paged_attention
from tests.kernels.test_oracle import PagedCase

pytestmark = pytest.mark.skipif(not cpu_ext.available(), reason="pagedeck's CPU kernels did not build here")

OPTIONS = {
    "norms": dict(norms=True),
    "window": dict(window=48),
    "softcap": dict(softcap=5.0),
    "partial rotary": dict(rot=32),
    "factor": dict(factor=1.3),
    "gemma3": dict(norms=True, window=40),
    "gpt-oss": dict(window=64, sinks=True, factor=1.2),
    "gemma2": dict(window=40, softcap=3.0),
    "everything": dict(norms=True, window=100, softcap=4.0, rot=32, sinks=True, factor=0.9),
}


class Layer:
    """One layer's options, its weights drawn from `seed`."""

    def __init__(self, Hq: int, D: int, seed: int, norms=False, window=None, softcap=None, rot=None, sinks=False,
                 factor=1.0):
        g = torch.Generator().manual_seed(seed)
        self.q_norm = torch.rand(D, generator=g) + 0.5 if norms else None
        self.k_norm = torch.rand(D, generator=g) + 0.5 if norms else None
        self.window, self.softcap, self.factor = window, softcap, factor
        self.rot = rot or D
        self.sinks = torch.randn(Hq, generator=g) if sinks else None
        self.inv_freq = 1.0 / (10000 ** (torch.arange(0, self.rot, 2).float() / self.rot))


def inputs(seqs, Hq, Hkv, D, ps, seed, dtype):
    case = PagedCase(seqs, Hq, Hkv, D, ps, dtype=dtype, seed=seed)
    g = torch.Generator().manual_seed(seed + 1)
    qkv = torch.randn(sum(ql for ql, _ in seqs), (Hq + 2 * Hkv) * D, generator=g) * 2
    positions = torch.cat([torch.arange(kv - ql, kv) for ql, kv in seqs])
    slots = torch.cat([case.slots(b, kv - ql, kv, ps) for b, (ql, kv) in enumerate(seqs)])
    return case, qkv, positions, slots


def fused(layer: Layer, qkv, k_pool, v_pool, slots, table, cu, kv, positions, Hq, D, ps):
    plan = kernels.plan_step(positions, layer.inv_freq, table, cu, kv, ps, fuse=True)
    assert plan.fused
    return kernels.fused_attention(qkv, k_pool, v_pool, slots, table, cu, kv, Hq, D ** -0.5, plan, layer.sinks,
                                   rotary=plan.rotary_tables(layer.inv_freq, layer.factor), q_norm=layer.q_norm,
                                   k_norm=layer.k_norm, norm_eps=1e-6, window=layer.window, softcap=layer.softcap,
                                   with_q=True)


def reference(layer: Layer, qkv, case, slots, positions, Hq, Hkv, D):
    T = qkv.shape[0]
    q = qkv[:, : Hq * D].reshape(T, Hq, D)
    k = qkv[:, Hq * D : (Hq + Hkv) * D].reshape(T, Hkv, D)
    v = qkv[:, (Hq + Hkv) * D :].reshape(T, Hkv, D)
    if layer.q_norm is not None:
        q, k = ref.rms_norm(q, layer.q_norm, 1e-6)[0], ref.rms_norm(k, layer.k_norm, 1e-6)[0]
    q, k = q.contiguous(), k.contiguous()
    ref.apply_rotary(q[..., : layer.rot], k[..., : layer.rot], positions, layer.inv_freq,
                     attention_factor=layer.factor)
    k_pool, v_pool = case.k_cache.clone(), case.v_cache.clone()
    ref.write_kv(k, v, k_pool, v_pool, slots)
    o = paged_attention(q, k_pool, v_pool, case.block_table, case.cu_q, case.kv, D ** -0.5, window=layer.window,
                        softcap=layer.softcap, sinks=layer.sinks)
    return o.reshape(T, Hq * D), q, (k_pool, v_pool)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("name", list(OPTIONS))
@pytest.mark.parametrize("seqs,Hq,Hkv,D,ps", [
    ([(1, 1), (1, 37), (1, 300), (1, 1200)], 8, 2, 64, 16),  # decode; long contexts split into slices
    ([(5, 40), (1, 17), (3, 290), (16, 16)], 4, 2, 96, 16),  # D % 64 != 0 (the generic path); verification rows
    ([(1, 33), (120, 600), (1, 70)], 6, 2, 64, 16),  # a long prefill chunk beside
])
def test_each_option_matches_the_reference_ops(name, dtype, seqs, Hq, Hkv, D, ps):
    layer = Layer(Hq, D, seed=len(name), **OPTIONS[name])
    case, qkv, positions, slots = inputs(seqs, Hq, Hkv, D, ps, seed=len(seqs) + Hq, dtype=dtype)
    k_pool, v_pool = case.k_cache.clone(), case.v_cache.clone()
    out, q = fused(layer, qkv, k_pool, v_pool, slots, case.block_table, case.cu_q, case.kv, positions, Hq, D, ps)
    expected, q_ref, (k_ref, v_ref) = reference(layer, qkv, case, slots, positions, Hq, Hkv, D)
    assert not out.isnan().any()
    torch.testing.assert_close(q, q_ref, rtol=1e-5, atol=1e-5)  # what image runs attend with
    if dtype == torch.float32:
        torch.testing.assert_close(k_pool.nan_to_num(), k_ref.nan_to_num(), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(out, expected, rtol=3e-5, atol=3e-5)
    else:  # the reference over the fused kernel's own q and pools (fp16 rounding of k may differ by an ulp)
        want = paged_attention(q, k_pool, v_pool, case.block_table, case.cu_q, case.kv, D ** -0.5,
                               window=layer.window, softcap=layer.softcap, sinks=layer.sinks)
        torch.testing.assert_close(out, want.reshape(out.shape), rtol=3e-5, atol=3e-5)
    assert torch.equal(v_pool.nan_to_num(), v_ref.nan_to_num())


def test_a_window_changes_what_a_row_sees():
    """A window narrower than the context gives other outputs than none (the option is not ignored), and one
    wider than every context gives the same bits as none."""
    seqs, Hq, Hkv, D, ps = [(1, 300), (4, 90)], 4, 2, 64, 16
    case, qkv, positions, slots = inputs(seqs, Hq, Hkv, D, ps, seed=3, dtype=torch.float32)

    def run(window):
        layer = Layer(Hq, D, seed=1, window=window)
        return fused(layer, qkv, case.k_cache.clone(), case.v_cache.clone(), slots, case.block_table, case.cu_q,
                     case.kv, positions, Hq, D, ps)[0]

    assert torch.equal(run(10_000), run(None))
    assert not torch.allclose(run(32), run(None), atol=1e-3)


@pytest.mark.parametrize("cuts", [[16, 40, 44, 600], [1] * 4 + [696], [513, 187]])
@pytest.mark.parametrize("name", ["gemma3", "gpt-oss", "everything"])
def test_a_rows_bits_do_not_depend_on_the_chunking_or_the_batch(name, cuts):
    """A 700-token prompt prefilled whole and in other chunks, and one decode row alone and beside another
    sequence, over fp16 pools: the same bits (a row's window starts at its own position)."""
    Hq, Hkv, D, ps = 8, 2, 64, 16
    layer = Layer(Hq, D, seed=5, **OPTIONS[name])
    case, qkv, positions, slots = inputs([(700, 700)], Hq, Hkv, D, ps, seed=11, dtype=torch.float16)
    table = case.block_table

    def prefill(chunks: list[int]) -> torch.Tensor:
        k_pool, v_pool, outs, start = case.k_cache.clone(), case.v_cache.clone(), [], 0
        for n in chunks:
            rows = slice(start, start + n)
            cu, kv = torch.tensor([0, n], dtype=torch.int32), torch.tensor([start + n], dtype=torch.int32)
            outs.append(fused(layer, qkv[rows], k_pool, v_pool, slots[rows], table, cu, kv, positions[rows], Hq, D,
                              ps)[0])
            start += n
        return torch.cat(outs)

    assert torch.equal(prefill(cuts), prefill([700]))
    case, qkv, positions, slots = inputs([(1, 700), (1, 900)], Hq, Hkv, D, ps, seed=12, dtype=torch.float16)
    one = slice(0, 1)
    alone = fused(layer, qkv[one], case.k_cache.clone(), case.v_cache.clone(), slots[one], case.block_table[:1],
                  case.cu_q[:2], case.kv[:1], positions[one], Hq, D, ps)[0]
    both = fused(layer, qkv, case.k_cache.clone(), case.v_cache.clone(), slots, case.block_table, case.cu_q,
                 case.kv, positions, Hq, D, ps)[0]
    assert torch.equal(both[:1], alone)


def test_bad_options_are_refused_by_name():
    seqs, Hq, Hkv, D, ps = [(1, 20)], 4, 2, 64, 16
    case, qkv, positions, slots = inputs(seqs, Hq, Hkv, D, ps, seed=0, dtype=torch.float32)
    layer = Layer(Hq, D, seed=0, norms=True)
    plan = kernels.plan_step(positions, layer.inv_freq, case.block_table, case.cu_q, case.kv, ps, fuse=True)
    args = (qkv, case.k_cache, case.v_cache, slots, case.block_table, case.cu_q, case.kv, Hq, 0.1, plan)
    with pytest.raises(ValueError, match="sliding window"):
        kernels.fused_attention(*args, window=0)
    with pytest.raises(ValueError, match="softcap"):
        kernels.fused_attention(*args, softcap=-1.0)
    with pytest.raises(RuntimeError, match="q_norm and k_norm"):
        kernels.fused_attention(*args, q_norm=layer.q_norm)
    with pytest.raises(RuntimeError, match=r"q_norm and k_norm must be \(D,\)"):
        kernels.fused_attention(*args, q_norm=layer.q_norm[:8], k_norm=layer.k_norm[:8])
