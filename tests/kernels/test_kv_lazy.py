"""KV pools take memory only as pages are written: a pool sized for the whole context is an anonymous map
whose pages the kernel zero-fills on first touch, so unwritten pages read as zeros and cost nothing."""
from __future__ import annotations

import mmap

import numpy as np
import torch

from kernels import kv_quant
from kernels.kv_quant import QuantizedPool, make_pool

MB = 1 << 20


def committed_bytes(*tensors: torch.Tensor) -> int:
    """Bytes of these tensors' own memory that hold pages of this process's own (/proc/self/pagemap: present
    and mapped exclusively here): what writing them committed. Not the shared zero page a read of an unwritten
    page maps, and not the rest of the process: its RssAnon moves whenever another thread (a C++ worker, a
    server left by an earlier test) allocates or frees, which broke bounds of a few MB in the full suite."""
    page, total = mmap.PAGESIZE, 0
    with open("/proc/self/pagemap", "rb") as f:
        for t in tensors:
            first, end = t.data_ptr() // page, -(-(t.data_ptr() + t.nbytes) // page)
            f.seek(first * 8)
            entries = np.frombuffer(f.read((end - first) * 8), dtype=np.uint64)
            present, exclusive = entries >> np.uint64(63), (entries >> np.uint64(56)) & np.uint64(1)
            total += int((present & exclusive).sum()) * page
    return total


def test_a_big_fp16_pool_is_resident_only_where_written():
    pool = make_pool(None, 512, 256, 8, 128, torch.float16)  # 256 MB: an 8B model's layer at 131k tokens
    assert pool.numel() * 2 == 256 * MB
    assert committed_bytes(pool) < 16 * MB
    assert not pool[::37].any()  # reads zeros (and touches only the pages it reads)
    touched = committed_bytes(pool)
    pool[:32] = 1.0  # 32 pages of 512 KB
    assert committed_bytes(pool[:32]) == 16 * MB  # every written page
    grew = committed_bytes(pool) - touched
    assert 14 * MB <= grew <= 20 * MB, grew / MB  # and no more than a 2 MB huge page past either end
    assert pool[:32].eq(1).all() and not pool[32:64].any()


def test_a_quantized_pool_is_lazy_too_and_decodes_unwritten_pages_to_zero(monkeypatch):
    pool = QuantizedPool.empty("q4", 1024, 256, 8, 128)
    assert pool.nbytes > 100 * MB
    assert committed_bytes(*pool.tensors()) < 16 * MB
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
