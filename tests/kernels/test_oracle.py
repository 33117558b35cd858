"""A tiny, obviously-correct attention oracle and a paged-case builder (shared by the kernel tests),
and the torch reference implementations checked against it and against transformers."""

from __future__ import annotations

import math

import pytest
import torch

import kernels
from kernels import reference_attention as ref_attention
from kernels import reference as ref
from kernels.kv_quant import QuantizedPool


def oracle_attention(q, seq_k, seq_v, q_lens, scale, window=None, softcap=None):
    """Per sequence: repeat_interleave KV heads, fp32 softmax, triu causal mask offset by kv_len - q_len;
    a sliding window also hides keys window or more positions back (tril), softcap caps the scores."""
    outs, start = [], 0
    for K, V, ql in zip(seq_k, seq_v, q_lens):
        L, Hq = K.shape[0], q.shape[1]
        G = Hq // K.shape[1]
        K = K.float().repeat_interleave(G, dim=1)
        V = V.float().repeat_interleave(G, dim=1)
        Q = q[start:start + ql].float()
        s = torch.einsum("qhd,khd->hqk", Q, K) * scale
        if softcap is not None:
            s = softcap * torch.tanh(s / softcap)
        s = s.masked_fill(torch.ones(ql, L).triu(L - ql + 1).bool(), float("-inf"))
        if window is not None:
            s = s.masked_fill(torch.ones(ql, L).tril(L - ql - window).bool(), float("-inf"))
        outs.append(torch.einsum("hqk,khd->qhd", s.softmax(-1), V))
        start += ql
    return torch.cat(outs)


class PagedCase:
    """Random sequences scattered over shuffled, non-contiguous pages; every unwritten slot is NaN."""

    def __init__(self, seqs, Hq, Hkv, D, page_size, num_pages=None, dtype=torch.float32, quant=None, seed=0,
                 device="cpu", rotate=True, consecutive=False):
        g = torch.Generator().manual_seed(seed)
        self.q_lens = [ql for ql, _ in seqs]
        self.kv_lens = [kv for _, kv in seqs]
        need = [math.ceil(kv / page_size) for kv in self.kv_lens]
        num_pages = num_pages or 2 * sum(need) + 3
        P = max(need) + 2
        perm = torch.arange(num_pages) if consecutive else torch.randperm(num_pages, generator=g)
        self.block_table = torch.zeros(len(seqs), P, dtype=torch.int32)
        used = 0
        for b, n in enumerate(need):
            self.block_table[b, :n] = perm[used:used + n].to(torch.int32)
            used += n
        shape = (num_pages, page_size, Hkv, D)
        if quant is None:
            self.k_cache = torch.full(shape, float("nan"), dtype=dtype)
            self.v_cache = torch.full(shape, float("nan"), dtype=dtype)
        else:
            self.k_cache = QuantizedPool.empty(quant, num_pages, page_size, Hkv, D, group_size=min(32, D), rotate=rotate)
            self.v_cache = QuantizedPool.empty(quant, num_pages, page_size, Hkv, D, group_size=min(32, D), rotate=rotate)
            for pool in (self.k_cache, self.v_cache):
                pool.scales.fill_(float("nan"))  # unwritten slots dequantize to NaN
        self.seq_k, self.seq_v = [], []
        for b, kv in enumerate(self.kv_lens):
            k = torch.randn(kv, Hkv, D, generator=g).to(dtype)
            v = torch.randn(kv, Hkv, D, generator=g).to(dtype)
            slots = self.slots(b, 0, kv, page_size)
            ref.write_kv(k, v, self.k_cache, self.v_cache, slots)
            if quant is not None:  # the oracle sees exactly what the pool holds
                k = self.k_cache.gather(slots // page_size, torch.float32)[torch.arange(kv), slots % page_size]
                v = self.v_cache.gather(slots // page_size, torch.float32)[torch.arange(kv), slots % page_size]
            self.seq_k.append(k)
            self.seq_v.append(v)
        self.q = torch.randn(sum(self.q_lens), Hq, D, generator=g).to(dtype)
        self.cu_q = torch.tensor([0] + list(torch.tensor(self.q_lens).cumsum(0)), dtype=torch.int32)
        self.kv = torch.tensor(self.kv_lens, dtype=torch.int32)
        self.scale = D ** -0.5
        self.to(device)

    def slots(self, b, start, end, page_size):
        pos = torch.arange(start, end)
        return self.block_table[b, pos // page_size].to(torch.int64) * page_size + pos % page_size

    def to(self, device):
        for name in ("q", "cu_q", "kv", "block_table"):
            setattr(self, name, getattr(self, name).to(device))
        if isinstance(self.k_cache, QuantizedPool):
            for pool in (self.k_cache, self.v_cache):
                for f in ("data", "high", "scales", "rotation"):
                    if getattr(pool, f) is not None:
                        setattr(pool, f, getattr(pool, f).to(device))
        else:
            self.k_cache, self.v_cache = self.k_cache.to(device), self.v_cache.to(device)

    def args(self):
        return self.q, self.k_cache, self.v_cache, self.block_table, self.cu_q, self.kv, self.scale

    def expected(self, window=None, softcap=None):
        return oracle_attention(self.q.cpu(), self.seq_k, self.seq_v, self.q_lens, self.scale, window, softcap)


MIXED = [(1, 37), (5, 300), (40, 40), (1, 1), (19, 533), (3, 16)]  # decode, verify, fresh prefill, chunk


@pytest.mark.parametrize("Hq,Hkv", [(4, 4), (6, 2), (16, 2)])
@pytest.mark.parametrize("page_size", [16, 256])
def test_reference_attention_matches_oracle(Hq, Hkv, page_size):
    case = PagedCase(MIXED, Hq, Hkv, 32, page_size, seed=Hq * page_size)
    out = kernels.paged_attention(*case.args())
    torch.testing.assert_close(out, case.expected(), atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("seqs", [[(1, 700), (1, 3), (1, 256), (1, 17)], [(4, 90), (4, 4)], [(300, 300)]])
def test_reference_attention_decode_verify_prefill_paths(seqs):
    case = PagedCase(seqs, 6, 2, 16, 16, seed=len(seqs))
    torch.testing.assert_close(kernels.paged_attention(*case.args()), case.expected(), atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("seqs", [[(1, 700), (1, 3), (1, 256), (1, 17)], [(1, 40)], [(300, 300)], MIXED])
def test_reference_attention_on_consecutive_pages_reads_pool_views(seqs):
    """Each sequence on consecutive pages: the reference attends to views of the pool (no gather); the
    NaN in unwritten slots right after each sequence must still stay out, with or without a step plan."""
    case = PagedCase(seqs, 6, 2, 16, 16, seed=7, consecutive=True)
    torch.testing.assert_close(kernels.paged_attention(*case.args()), case.expected(), atol=2e-5, rtol=1e-5)
    plan = kernels.plan_step(torch.zeros(case.q.shape[0], dtype=torch.long), torch.ones(8), case.block_table,
                             case.cu_q, case.kv, 16)
    torch.testing.assert_close(kernels.paged_attention(*case.args(), plan=plan), case.expected(), atol=2e-5,
                               rtol=1e-5)
    other = kernels.plan_step(torch.zeros(1, dtype=torch.long), torch.ones(8), case.block_table[:1],
                              case.cu_q[:2], case.kv[:1], 16)
    if len(seqs) > 1:
        with pytest.raises(ValueError, match="different batch"):
            kernels.paged_attention(*case.args(), plan=other)


@pytest.mark.parametrize("fmt", ["q8", "q6", "q4"])
def test_reference_attention_reads_quantized_pools(fmt):
    case = PagedCase(MIXED, 6, 2, 64, 16, quant=fmt, seed=3)
    torch.testing.assert_close(kernels.paged_attention(*case.args()), case.expected(), atol=2e-5, rtol=1e-5)


WINDOWED = [  # every path of the reference: lone decode, batched decode, verification, short and long prefill
    [(1, 700)], [(1, 700), (1, 3), (1, 256), (1, 17)], [(4, 90), (4, 4)], [(300, 300)], [(40, 200)], MIXED,
]


@pytest.mark.parametrize("consecutive", [False, True], ids=["gathered", "pool-views"])
@pytest.mark.parametrize("seqs", WINDOWED, ids=["decode1", "decode4", "verify", "prefill", "chunk", "mixed"])
def test_reference_attention_sliding_window_and_softcap(seqs, consecutive):
    """Windows shorter than, equal to and longer than the sequences, with and without soft-capping; the
    large-score case (q scaled up) makes capping change the result, so a dropped cap fails."""
    case = PagedCase(seqs, 6, 2, 16, 16, seed=5, consecutive=consecutive)
    case.q *= 4
    plan = kernels.plan_step(torch.zeros(case.q.shape[0], dtype=torch.long), torch.ones(8), case.block_table,
                             case.cu_q, case.kv, 16)
    for window, softcap in ((1, None), (37, None), (256, 20.0), (5000, 5.0), (None, 5.0)):
        want = case.expected(window, softcap)
        got = kernels.paged_attention(*case.args(), plan=plan, window=window, softcap=softcap)
        torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-5, msg=f"window={window} softcap={softcap}")
    assert not torch.allclose(case.expected(37), case.expected()) and not torch.allclose(
        case.expected(None, 5.0), case.expected())


def test_reference_attention_window_on_quantized_pool():
    case = PagedCase(MIXED, 6, 2, 64, 16, quant="q8", seed=3)
    torch.testing.assert_close(kernels.paged_attention(*case.args(), window=50, softcap=30.0),
                               case.expected(50, 30.0), atol=2e-5, rtol=1e-5)


def test_reference_attention_rejects_bad_layer_options():
    case = PagedCase([(3, 20)], 4, 2, 16, 16)
    with pytest.raises(ValueError, match="sliding window"):
        kernels.paged_attention(*case.args(), window=0)
    with pytest.raises(ValueError, match="softcap"):
        kernels.paged_attention(*case.args(), softcap=-1.0)


def test_reference_attention_rejects_bad_lengths():
    case = PagedCase([(3, 20)], 4, 2, 16, 16)
    with pytest.raises(ValueError, match="q_len"):
        kernels.paged_attention(case.q, case.k_cache, case.v_cache, case.block_table, case.cu_q,
                                torch.tensor([2], dtype=torch.int32), case.scale)
    with pytest.raises(ValueError, match="multiple of Hkv"):
        kernels.paged_attention(case.q[:, :3], case.k_cache, case.v_cache, case.block_table, case.cu_q, case.kv,
                                case.scale)


def test_write_kv_scatters_into_slots():
    k_cache = torch.zeros(6, 4, 2, 8)
    v_cache = torch.zeros(6, 4, 2, 8)
    k, v = torch.randn(3, 2, 8), torch.randn(3, 2, 8)
    kernels.write_kv(k, v, k_cache, v_cache, torch.tensor([5 * 4 + 3, 0, 2 * 4 + 1]))
    torch.testing.assert_close(k_cache[5, 3], k[0])
    torch.testing.assert_close(v_cache[2, 1], v[2])
    assert k_cache.count_nonzero() == 3 * 2 * 8


def test_rms_norm_and_rotary_match_transformers():
    from transformers.models.llama.modeling_llama import LlamaRMSNorm, apply_rotary_pos_emb

    x, res = torch.randn(5, 48), torch.randn(5, 48)
    norm = LlamaRMSNorm(48, eps=1e-5)
    norm.weight.data = torch.randn(48)
    out, res_out = kernels.rms_norm(x, norm.weight.data, 1e-5, res)
    torch.testing.assert_close(res_out, x + res)
    torch.testing.assert_close(out, norm(x + res))
    out, res_out = kernels.rms_norm(x, norm.weight.data, 1e-5)
    torch.testing.assert_close(out, norm(x))
    assert res_out is x

    D, pos = 16, torch.tensor([0, 7, 3, 1000])
    q, k = torch.randn(4, 6, D), torch.randn(4, 2, D)
    inv_freq = 1.0 / (10000 ** (torch.arange(0, D, 2).float() / D))
    emb = torch.cat([pos[:, None].float() * inv_freq] * 2, dim=-1)
    q_hf, k_hf = apply_rotary_pos_emb(q.transpose(0, 1)[None], k.transpose(0, 1)[None], emb.cos()[None], emb.sin()[None])
    kernels.apply_rotary(q, k, pos, inv_freq)
    torch.testing.assert_close(q, q_hf[0].transpose(0, 1))
    torch.testing.assert_close(k, k_hf[0].transpose(0, 1))


def test_silu_mul():
    gu = torch.randn(3, 10)
    torch.testing.assert_close(kernels.silu_mul(gu), torch.nn.functional.silu(gu[:, :5]) * gu[:, 5:])


def test_gelu_tanh_mul_matches_transformers_gelu_pytorch_tanh():
    from transformers.activations import ACT2FN

    gu = torch.randn(3, 10) * 3
    torch.testing.assert_close(kernels.gelu_tanh_mul(gu), ACT2FN["gelu_pytorch_tanh"](gu[:, :5]) * gu[:, 5:])


def test_rotary_attention_factor_and_partial_rotary_match_transformers():
    """Phi-3's LongRoPE multiplies cos/sin by an attention factor; Phi-4-mini rotates only the first
    rotary_dim dims of each head: a view of those dims goes through the same op."""
    from transformers.models.phi3.modeling_phi3 import apply_rotary_pos_emb

    D, R, pos = 32, 24, torch.tensor([0, 5, 4000, 9])
    q, k = torch.randn(4, 6, D), torch.randn(4, 2, D)
    inv_freq = 1.0 / (10000 ** (torch.arange(0, R, 2).float() / R))
    emb = torch.cat([pos[:, None].float() * inv_freq] * 2, dim=-1)
    cos, sin = emb.cos() * 1.19, emb.sin() * 1.19
    q_hf, k_hf = apply_rotary_pos_emb(q.transpose(0, 1)[None], k.transpose(0, 1)[None], cos[None], sin[None])
    plan = kernels.plan_step(pos, inv_freq, torch.zeros(4, 1, dtype=torch.int32), torch.arange(5, dtype=torch.int32),
                             torch.ones(4, dtype=torch.int32), 16)
    kernels.apply_rotary(q[..., :R], k[..., :R], pos, inv_freq, plan, attention_factor=1.19)
    torch.testing.assert_close(q, q_hf[0].transpose(0, 1))
    torch.testing.assert_close(k, k_hf[0].transpose(0, 1))


def test_pad_vocab_and_embedding():
    assert [kernels.pad_vocab(n) for n in (1, 32, 33, 49152, 151936, 32001)] == [32, 32, 64, 49152, 151936, 32032]
    padded = kernels.pad_embedding(torch.ones(50, 4))
    assert padded.shape == (64, 4) and (padded[:50] == 1).all() and (padded[50:] == 0).all()
    same = torch.ones(64, 4)
    assert kernels.pad_embedding(same) is same
