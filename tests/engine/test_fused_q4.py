"""All-Q4_K q|k|v and gate|up groups copied straight into their fused q4k matrix (engine.model.packing.fused_q4) give
the bits of packing each part and stacking them (qlinear.cat_packed), in a Q4_K_M file whose mixed groups
(Q6_K v) still take cat_packed (each part in its own format); the memory estimate stays byte for byte."""

import pytest
import torch

from engine import Model
from engine.cache.paged_cache import PagedCache
from engine.model.packing import fused_q4
from engine.model.catalog import memory
from engine.model.batch import Batch
from engine.model.qlinear import PartsLinear, Q4KLinear, Q8Linear
from kernels import cpu_ext
from tools.models.synthetic_gguf import write_random_gguf

pytestmark = pytest.mark.skipif(not cpu_ext.available(), reason="pagedeck's CPU kernels did not build here")


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    # 8 layers: llama.cpp's Q4_K_M recipe makes attn_v Q6_K in layers 0, 3, 6 and 7 (mixed q|k|v), Q4_K else
    return write_random_gguf(tmp_path_factory.mktemp("fused") / "m.gguf", "tiny-256", 8, "Q4_K_M")


def _bits(m) -> list[torch.Tensor]:
    return [t.contiguous().view(torch.uint8) for t in m.blocks if t is not None]


def test_fused_while_reading_matches_stacking(path, monkeypatch):
    monkeypatch.setenv("PAGEDECK_DENSE_COPY", "0")  # a dense copy takes the stacking route
    planned = []
    real_plan = fused_q4.plan
    monkeypatch.setattr(fused_q4, "plan", lambda *a: planned.append(real_plan(*a)) or planned[-1])
    direct = Model.load(path, weights="packed")
    targets = {t.name for t in planned[0].values()}
    assert len(targets) == 8 + 4  # every gate|up, the q|k|v of the four all-Q4_K layers
    monkeypatch.setattr(fused_q4, "plan", lambda *a: {})
    stacked = Model.load(path, weights="packed")
    for i, (a, b) in enumerate(zip(direct.layers, stacked.layers)):
        assert isinstance(a.gate_up, Q4KLinear)
        assert isinstance(a.qkv, PartsLinear if i in (0, 3, 6, 7) else Q4KLinear)
        for name in ("qkv", "gate_up"):
            x, y = getattr(a, name), getattr(b, name)
            assert type(x) is type(y) and x.shape == y.shape
            assert all(torch.equal(p, q) for p, q in zip(_bits(x), _bits(y))), (i, name)
            if not isinstance(x, Q8Linear):  # q4k: no separate scales
                continue
            # the SCALE_PAD tail behind the scales is zero, as the kernels expect
            tail = x.scale.untyped_storage().nbytes() // 2 - x.scale.numel()
            pad = torch.empty(0, dtype=torch.float16).set_(x.scale.untyped_storage())[x.scale.numel():]
            assert tail > 0 and not pad.any()
    batch = Batch.build([(list(range(3, 20)), 0, [0, 1])], 256, [17])
    la = direct.forward(batch, PagedCache(direct, max_tokens=64, page_size=16))
    lb = stacked.forward(batch, PagedCache(stacked, max_tokens=64, page_size=16))
    assert torch.equal(la, lb)


def test_estimate_still_byte_for_byte(path, monkeypatch):
    monkeypatch.setenv("PAGEDECK_DENSE_COPY", "0")
    est = memory.estimate_memory(path, weights="packed")
    model = Model.load(path, weights="packed")
    assert est.weights_bytes == model.memory_bytes()
