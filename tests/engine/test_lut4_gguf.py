"""GGUFs of MXFP4, IQ4_NL, IQ4_XS, Q3_K and Q2_K matrices (written by gguf-py: its MXFP4 quantizer,
tools.ggml_writers' IQ4, Q3_K and Q2_K ones) load with weights="packed" keeping those formats (kernels/cpu/lut4.h;
q6.h's Q3K and Q2K layouts), not
re-quantized to q8, and give
the dequantized dense model's logits: prompt rows through the exact weights decoded just in time, generated
rows through the kernels; the memory estimate is the storage loading keeps, byte for byte."""

import pytest
import torch

from engine import Model
from engine.cache.paged_cache import PagedCache
from engine.model.batch import Batch
from engine.model.catalog import memory
from engine.model.embedding import GGMLRows
from kernels import cpu_ext
from tools.models.synthetic_gguf import write_random_gguf

pytestmark = pytest.mark.skipif(not cpu_ext.available(), reason="pagedeck's CPU kernels did not build here")

# the type -> (its kernel format, a tiny shape whose rows it fits: IQ4_XS and the K-quants need rows of 256)
CASES = {"MXFP4": ("mxfp4", "tiny"), "IQ4_NL": ("iq4nl", "tiny"), "IQ4_XS": ("iq4xs", "tiny-256"),
         "Q3_K": ("q3k", "tiny-256"), "Q2_K": ("q2k", "tiny-256")}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("lut4")
    return {q: write_random_gguf(d / f"{q}.gguf", shape, 2, q) for q, (_, shape) in CASES.items()}


def _logits(model: Model, prompt: bool) -> torch.Tensor:
    batch = Batch.build([(list(range(3, 20)), 0, [0, 1])], 256, [17], prompt_seqs=[prompt])
    return model.forward(batch, PagedCache(model, max_tokens=64, page_size=16))


@pytest.mark.parametrize("qtype", list(CASES))
def test_loads_in_its_own_format_with_the_dense_models_logits(files, qtype, monkeypatch):
    fmt = CASES[qtype][0]
    dense = Model.load(files[qtype], weights="dense")
    packed = Model.load(files[qtype], weights="packed")
    for layer in packed.layers:
        assert [w.format for w in (layer.qkv, layer.o, layer.gate_up, layer.down)] == [fmt] * 4
    assert packed.lm_head.format == fmt and isinstance(packed.embed, GGMLRows)
    # prompt rows: the file's exact weights (decoded just in time), so the dense model's logits up to fp32
    # summation order (a fused q|k|v against separate products), over pools of the dense model's element type
    # (a packed model's own are fp16: engine.cache.budget.pool_dtype)
    want = _logits(dense, True)
    monkeypatch.setattr(packed, "kv_pool_dtype", lambda: torch.float32)
    got = _logits(packed, True)
    monkeypatch.undo()
    assert packed.layers[0].down.jit_dense and packed.layers[0].down.dense is None
    assert ((got - want).norm() / want.norm()).item() < 1e-5
    # generated rows: the kernels (int8 activations per 32), close to the dense weights' products
    monkeypatch.setenv("PAGEDECK_DENSE_COPY", "0")
    kernels_only = Model.load(files[qtype], weights="packed")
    assert not kernels_only.layers[0].down.prompt_dense and kernels_only.lm_head.format == fmt
    for prompt in (True, False):
        got = _logits(kernels_only, prompt)
        assert ((got - want).norm() / want.norm()).item() < 3e-2
        assert (got.argmax(-1) == want.argmax(-1)).float().mean().item() >= 0.9
    assert torch.equal(_logits(kernels_only, False), _logits(packed, False))  # generated rows: one path


@pytest.mark.parametrize("qtype", list(CASES))
def test_estimate_is_the_storage_loading_keeps(files, qtype, monkeypatch):
    monkeypatch.setenv("PAGEDECK_DENSE_COPY", "0")
    est = memory.estimate_memory(files[qtype], weights="packed")
    model = Model.load(files[qtype], weights="packed")
    assert est.weights_bytes == model.memory_bytes()
    assert model.memory_bytes() <= 1.1 * files[qtype].stat().st_size  # as q8 the matrices took 2x their bytes
