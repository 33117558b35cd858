"""KV pools take memory only as pages are written: a pool sized for the whole context is an anonymous map
whose pages the kernel zero-fills on first touch, so unwritten pages read as zeros and cost nothing."""
from __future__ import annotations

import torch

from kernels import kv_quant
from kernels.kv_quant import QuantizedPool, make_pool

MB = 1 << 20


def anon_bytes() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("RssAnon"))


def test_a_big_fp16_pool_is_resident_only_where_written():
    before = anon_bytes()
    pool = make_pool(None, 512, 256, 8, 128, torch.float16)  # 256 MB: an 8B model's layer at 131k tokens
    assert pool.numel() * 2 == 256 * MB
    assert anon_bytes() - before < 16 * MB
    assert not pool[::37].any()  # reads zeros (and touches only the pages it reads)
    touched = anon_bytes()
    pool[:32] = 1.0  # 32 pages of 512 KB
    grew = anon_bytes() - touched
    assert 14 * MB <= grew <= 20 * MB, grew / MB
    assert pool[:32].eq(1).all() and not pool[32:64].any()


def test_a_quantized_pool_is_lazy_too_and_decodes_unwritten_pages_to_zero(monkeypatch):
    before = anon_bytes()
    pool = QuantizedPool.empty("q4", 1024, 256, 8, 128)
    assert pool.nbytes > 100 * MB
    assert anon_bytes() - before < 16 * MB
    assert pool.gather(torch.tensor([3, 900]), torch.float32).abs().max().item() == 0.0
    monkeypatch.setattr(kv_quant, "LAZY_MIN_BYTES", 1 << 62)
    eager = QuantizedPool.empty("q4", 8, 256, 8, 128)  # torch.zeros tensors: the oracle
    x = torch.randn(256, 8, 128)
    slots = torch.arange(256 * 5, 256 * 6)  # page 5
    pool.write(x, slots)
    eager.write(x, slots)
    assert torch.equal(pool.gather(torch.tensor([5, 6]), torch.float32), eager.gather(torch.tensor([5, 6]), torch.float32))


def test_small_pools_and_copies_behave_as_plain_tensors():
    small = make_pool(None, 2, 16, 2, 8, torch.float32)  # under the lazy size: torch.zeros
    assert small.shape == (2, 16, 2, 8) and not small.any()
    big = make_pool(None, 64, 256, 4, 64, torch.bfloat16)
    big[3] = 2.0
    big.copy_(big.index_select(0, torch.tensor([3] * 64)))  # defragmentation's permute writes every page
    assert big.eq(2).all() and big.is_contiguous()
