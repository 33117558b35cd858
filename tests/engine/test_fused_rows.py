"""Q5_0 / Q5_1 / Q8_0 q|k|v and gate|up groups written straight into their fused q5 or q8 matrix
(engine.model.packing.fused_on_read.FusedRows) give the bits of packing each part and stacking them
(qlinear.cat_packed): codes, scales and the zero SCALE_PAD tail, the same logits, and the memory estimate
stays byte for byte. A 64-wide Q4_K_M file is the Gemma-3-270M case: its K-quants fall back to Q5_0 / Q8_0
(gate|up Q5_0: fused; q|k Q5_0 beside a Q8_0 v in some layers: mixed, kept in parts)."""

import pytest
import torch

from engine import Model
from engine.model.catalog import memory
from engine.model.packing import fused_on_read
from engine.model.qlinear import PartsLinear, Q5Linear, Q8Linear
from kernels import cpu_ext
from tests.engine.fused_checks import assert_same_logits, gguf_file, load_fused_and_stacked, packed_bytes

pytestmark = pytest.mark.skipif(not cpu_ext.available(), reason="pagedeck's CPU kernels did not build here")


@pytest.fixture(scope="module", params=["Q5_0", "Q5_1", "Q8_0", "Q4_K_M"])
def path(request, tmp_path_factory):
    return gguf_file(tmp_path_factory, "fused_rows", "tiny", 3, request.param), request.param


def _pad(t: torch.Tensor) -> torch.Tensor:
    """The values behind a padded scale tensor's own, in its storage."""
    return torch.empty(0, dtype=torch.float16).set_(t.untyped_storage())[t.storage_offset() + t.numel():]


def test_fused_while_reading_matches_stacking(path, monkeypatch):
    path, quant = path
    plan, direct, stacked = load_fused_and_stacked(path, monkeypatch)
    targets = {t.name for t in plan.values()}
    whole_qkv = sum(not isinstance(lr.qkv, PartsLinear) for lr in direct.layers)
    assert len(targets) == 3 + whole_qkv  # every gate|up, each q|k|v of one type
    assert whole_qkv == 3 if quant != "Q4_K_M" else 0 < whole_qkv < 3  # Q4_K_M: a Q8_0 v somewhere (mixed)
    assert all(isinstance(t, fused_on_read.FusedRows) for t in plan.values())
    kind = Q8Linear if quant == "Q8_0" else Q5Linear
    for i, (a, b) in enumerate(zip(direct.layers, stacked.layers)):
        assert isinstance(a.gate_up, kind)
        assert isinstance(a.qkv, (PartsLinear, kind) if quant == "Q4_K_M" else kind)
        for name in ("qkv", "gate_up"):
            x, y = getattr(a, name), getattr(b, name)
            assert type(x) is type(y) and x.shape == y.shape
            assert all(torch.equal(p, q) for p, q in zip(packed_bytes(x), packed_bytes(y), strict=True)), (i, name)
            for s in (x.blocks[1:] if isinstance(x, (Q5Linear, Q8Linear)) else ()):
                if s is not None:  # the SCALE_PAD tail behind the scales is zero, as the kernels expect
                    assert _pad(s).numel() > 0 and not _pad(s).any()
    assert_same_logits(direct, stacked)


def test_fused_equals_dequantized_reference(path, monkeypatch):
    """The fused matrices decode to the file's exact weights (the dense load's)."""
    path, _ = path
    monkeypatch.setenv("PAGEDECK_DENSE_COPY", "0")
    packed = Model.load(path, weights="packed")
    dense = Model.load(path, weights="dense", dtype=torch.float32)
    for a, b in zip(packed.layers, dense.layers):
        assert torch.equal(a.gate_up.dequantize(), b.gate_up)
        assert torch.equal(a.qkv.dequantize(), b.qkv)


def test_estimate_still_byte_for_byte(path, monkeypatch):
    path, _ = path
    monkeypatch.setenv("PAGEDECK_DENSE_COPY", "0")
    est = memory.estimate_memory(path, weights="packed")
    model = Model.load(path, weights="packed")
    assert model.wait_settled(60)  # the estimate is the settled layout's (a start on the mapped file views it)
    assert est.weights_bytes == model.memory_bytes()
