"""All-Q4_K q|k|v and gate|up groups (and all-Q6_K, all-Q5_K, all-IQ4_XS ones) copied straight into their fused
matrix (engine.model.packing.fused_on_read) give the bits of packing each part and stacking them (qlinear.cat_packed), in
a Q4_K_M file whose mixed groups (Q6_K v) still take cat_packed (each part in its own format); the memory estimate
stays byte for byte."""

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


@pytest.mark.parametrize("quant", ["Q6_K", "Q5_K", "IQ4_XS"])
def test_other_superblock_types_fuse_while_reading(tmp_path_factory, monkeypatch, quant):
    """Q6_K, Q5_K and IQ4_XS groups (in 16-row groups where this build has their group kernels) are written
    straight into their fused matrix too, with the bits of stacking the parts."""
    path = gguf_file(tmp_path_factory, "fused-" + quant.lower(), "tiny-256", 4, quant)
    plan, direct, stacked = load_fused_and_stacked(path, monkeypatch)
    assert {type(t).__name__ for t in plan.values()} == {"FusedSuperBlocks"}
    fused = 0
    for i, (a, b) in enumerate(zip(direct.layers, stacked.layers)):
        for name in ("qkv", "gate_up"):
            x, y = getattr(a, name), getattr(b, name)
            assert type(x) is type(y) and x.shape == y.shape, (i, name)
            assert getattr(x, "grouped", None) == getattr(y, "grouped", None)
            assert all(torch.equal(p, q) for p, q in zip(packed_bytes(x), packed_bytes(y))), (i, name)
            fused += f"model.layers.{i}.{'self_attn.qkv' if name == 'qkv' else 'mlp.gate_up'}_proj.weight" in {
                t.name for t in plan.values()}
    assert fused >= 4  # at least every layer's gate|up
    assert_same_logits(direct, stacked)
