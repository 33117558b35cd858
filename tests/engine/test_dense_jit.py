"""Prompt rows of a small model decode each packed matrix to its exact fp32 weights just in time (a reused
scratch buffer) instead of keeping a dense copy: the logits are the kept copy's, bit for bit, and the
resident weights stay near the file's size."""
import gc

import pytest
import torch
from gguf import GGMLQuantizationType as QT

from engine import Model, Tokenizer
from engine.model.packing import repack
from engine.model.qlinear import scratch
from engine.model.qlinear import RowSplit, linear
from tests.engine.test_memory_gguf import _rss_kb
from tests.engine.test_qlinear import quantized
from tools.logits import forward_tokens


@pytest.mark.parametrize("qtype", [QT.Q4_0, QT.Q4_1, QT.Q8_0, QT.Q6_K, QT.Q4_K])
def test_each_exact_format_decodes_the_files_weights_bit_for_bit(qtype, monkeypatch):
    rows, cols = 300, 512
    raw, exact = quantized(qtype, rows, cols, int(qtype) + 7)
    w = repack.from_blocks(raw, qtype, (rows, cols))
    assert w.jit_dense and w.dense is None
    out = torch.full((rows, cols), float("nan"))
    w.dense_into(0, rows, out)
    assert torch.equal(out, exact)
    x = torch.randn(37, cols)
    assert torch.equal(linear(x, w, rows=RowSplit(torch.arange(37), 37)), torch.nn.functional.linear(x, exact))
    monkeypatch.setattr(scratch, "MAX_WEIGHTS", 64 * cols)  # a matrix taller than the scratch holds: 64-row slabs
    monkeypatch.setattr(scratch._local, "buf", None, raising=False)
    one = x[:1]  # a lone prompt row: the bits it has in the 37-row call (a few rows are padded to MIN_ROWS)
    torch.testing.assert_close(linear(one, w, rows=RowSplit(torch.arange(1), 1)),
                               torch.nn.functional.linear(x, exact)[:1], rtol=0, atol=0)


def _prompt_logits(model: Model, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Every prompt row's logits, and the last row's alone (what a generation's prefill asks for)."""
    return forward_tokens(model, ids), forward_tokens(model, ids)[-1:]


def test_default_model_prompt_logits_equal_the_kept_copy_bit_for_bit(monkeypatch):
    from tools.bench.weight_quality import TEXT

    ids = Tokenizer.load().encode(TEXT)[..., :96]
    monkeypatch.setenv("PAGEDECK_DENSE_COPY", "1")
    kept = Model.load(weights="packed")
    monkeypatch.delenv("PAGEDECK_DENSE_COPY")
    jit = Model.load(weights="packed")
    assert kept.prompt_dense and kept.lm_head.dense is not None
    assert jit.prompt_dense and jit.lm_head.jit_dense and jit.lm_head.dense is None
    assert all(t.dense is None for layer in jit.layers for t in layer.weights() if hasattr(t, "jit_dense"))
    assert torch.equal(forward_tokens(jit, ids), forward_tokens(kept, ids))
    assert torch.equal(forward_tokens(jit, ids[..., :7]), forward_tokens(kept, ids[..., :7]))


def test_default_model_weights_and_rss_stay_near_the_file(tmp_path):
    from engine.model.weights import default_model_path

    size = default_model_path().stat().st_size
    Model.load(weights="packed")  # kernels and lazy imports mapped before the baseline
    gc.collect()
    before = _rss_kb()
    model = Model.load(weights="packed")
    forward_tokens(model, Tokenizer.load().encode("What is the capital of France?"))  # the scratch buffer too
    gc.collect()
    after = _rss_kb()
    assert model.memory_bytes() <= 1.3 * size
    from engine.model.catalog import memory
    assert memory.estimate_memory(default_model_path(), weights="packed").weights_bytes == model.memory_bytes()
    assert (after["anon"] - before["anon"]) * 1024 <= 1.3 * size, (after, before, size)
