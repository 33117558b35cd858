"""All-Q4_K q|k|v and gate|up groups copied straight into their fused q4k matrix (engine.model.packing.fused_q4) give
the bits of packing each part and stacking them (qlinear.cat_packed), in a Q4_K_M file whose mixed groups
(Q6_K v) still take cat_packed (each part in its own format); the memory estimate stays byte for byte."""

import pytest
import torch

from engine import Model
from engine.model.catalog import memory
from engine.model.qlinear import PartsLinear, Q4KLinear, Q8Linear
from kernels import cpu_ext
from tests.engine.fused_checks import assert_same_logits, gguf_file, load_fused_and_stacked, packed_bytes

pytestmark = pytest.mark.skipif(not cpu_ext.available(), reason="pagedeck's CPU kernels did not build here")


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    # 8 layers: llama.cpp's Q4_K_M recipe makes attn_v Q6_K in layers 0, 3, 6 and 7 (mixed q|k|v), Q4_K else
    return gguf_file(tmp_path_factory, "fused", "tiny-256", 8, "Q4_K_M")


def test_fused_while_reading_matches_stacking(path, monkeypatch):
    plan, direct, stacked = load_fused_and_stacked(path, monkeypatch)
    targets = {t.name for t in plan.values()}
    assert len(targets) == 8 + 4  # every gate|up, the q|k|v of the four all-Q4_K layers
    for i, (a, b) in enumerate(zip(direct.layers, stacked.layers)):
        assert isinstance(a.gate_up, Q4KLinear)
        assert isinstance(a.qkv, PartsLinear if i in (0, 3, 6, 7) else Q4KLinear)
        for name in ("qkv", "gate_up"):
            x, y = getattr(a, name), getattr(b, name)
            assert type(x) is type(y) and x.shape == y.shape
            assert all(torch.equal(p, q) for p, q in zip(packed_bytes(x), packed_bytes(y))), (i, name)
            if not isinstance(x, Q8Linear):  # q4k: no separate scales
                continue
            # the SCALE_PAD tail behind the scales is zero, as the kernels expect
            tail = x.scale.untyped_storage().nbytes() // 2 - x.scale.numel()
            pad = torch.empty(0, dtype=torch.float16).set_(x.scale.untyped_storage())[x.scale.numel():]
            assert tail > 0 and not pad.any()
    assert_same_logits(direct, stacked)


def test_estimate_still_byte_for_byte(path, monkeypatch):
    monkeypatch.setenv("PAGEDECK_DENSE_COPY", "0")
    est = memory.estimate_memory(path, weights="packed")
    model = Model.load(path, weights="packed")
    assert est.weights_bytes == model.memory_bytes()
