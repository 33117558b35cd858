"""What the fused-group tests (test_fused_on_read, test_fused_rows) share: a synthetic GGUF file in its own temporary
folder, a file loaded both ways (groups written straight into their fused matrix while reading, and each part
packed then stacked), the packed bytes to compare, and the check that both loads give the same logits."""

from pathlib import Path

import torch

from engine import Model
from engine.cache.paged_cache import PagedCache
from engine.model.batch import Batch
from engine.model.packing import fused_on_read
from tools.models.synthetic_gguf import write_random_gguf


def gguf_file(tmp_path_factory, folder: str, arch: str, layers: int, quant: str) -> Path:
    """A random `arch` model of `layers` layers quantized as `quant`, written once into a fresh folder."""
    return write_random_gguf(tmp_path_factory.mktemp(folder) / "m.gguf", arch, layers, quant)


def load_fused_and_stacked(path: Path, monkeypatch) -> tuple[dict, Model, Model]:
    """The fusing plan fused_on_read made for the file, the model loaded with it (fused while reading) and the model
    loaded without one (every part packed, then stacked). The dense copy is off: it would take the stacking
    route in both loads."""
    monkeypatch.setenv("PAGEDECK_DENSE_COPY", "0")
    planned = []
    real_plan = fused_on_read.plan
    monkeypatch.setattr(fused_on_read, "plan", lambda *a: planned.append(real_plan(*a)) or planned[-1])
    direct = Model.load(path, weights="packed")
    monkeypatch.setattr(fused_on_read, "plan", lambda *a: {})
    stacked = Model.load(path, weights="packed")
    assert direct.wait_settled(60) and stacked.wait_settled(60)  # their layers as settled (engine.model.settle)
    return planned[0], direct, stacked


def packed_bytes(m) -> list[torch.Tensor]:
    """A packed matrix's tensors (codes, scales) as raw bytes, so that equality is bit for bit."""
    return [t.contiguous().view(torch.uint8) for t in m.blocks if t is not None]


def assert_same_logits(a: Model, b: Model) -> None:
    """One 17-token prompt through each model gives the same logits, bit for bit."""
    batch = Batch.build([(list(range(3, 20)), 0, [0, 1])], 256, [17])
    la = a.forward(batch, PagedCache(a, max_tokens=64, page_size=16))
    lb = b.forward(batch, PagedCache(b, max_tokens=64, page_size=16))
    assert torch.equal(la, lb)
