"""Packed weights (weights="q4": a GGUF's 4-bit blocks; "q8": int8 quantized at load): exact block decoding
and packing, close products, and the real model still right (vs dense, and as close as llama.cpp is)."""
import pytest
import torch
import torch.nn.functional as F
from gguf import GGMLQuantizationType as QT

from engine import Model, Tokenizer
from engine.model.qlinear import Q4Linear, Q8Linear, RowSplit, linear
from engine.model.weights import dequantize, q4_blocks


def random_blocks(qtype: QT, rows: int, cols: int, seed: int = 0) -> torch.Tensor:
    """Valid ggml bytes: fp16 scale (and min for Q4_1) per block of 32, then 16 bytes of nibbles."""
    g = torch.Generator().manual_seed(seed)
    n = rows * cols // 32
    d = (torch.rand(n, 1, generator=g) * 0.02 + 0.001).half().view(torch.uint8)
    parts = [d.reshape(n, 2)]
    if qtype == QT.Q4_1:
        parts.append((torch.randn(n, 1, generator=g) * 0.05).half().view(torch.uint8).reshape(n, 2))
    parts.append(torch.randint(0, 256, (n, 16), generator=g, dtype=torch.uint8))
    return torch.cat(parts, dim=1).reshape(rows, -1)


@pytest.mark.parametrize("qtype", [QT.Q4_0, QT.Q4_1])
def test_blocks_decode_exactly_and_multiply_closely(qtype):
    rows, cols = 96, 128
    raw = random_blocks(qtype, rows, cols)
    dense = dequantize(raw, qtype, (rows, cols))
    w = Q4Linear(*q4_blocks(raw, qtype, (rows, cols)))
    torch.testing.assert_close(w.dequantize(), dense, atol=1e-6, rtol=0)  # same weights as the dense path
    x = torch.randn(5, cols)
    ref = F.linear(x, dense)
    rel = ((w(x) - ref).norm() / ref.norm()).item()
    assert rel < 1e-2, rel  # bf16 activations and scales
    assert w(x[0]).shape == (rows,) and w(x).dtype == torch.float32
    many = torch.randn(40, cols)
    prompt = RowSplit(torch.arange(40), 40)  # all prompt rows: the dense copy, exact
    torch.testing.assert_close(linear(many, w, rows=prompt), F.linear(many, dense))
    mixed = RowSplit(torch.tensor([0, 1, 2, 7]), 40)  # prompt rows dense, the rest 4-bit, row by row
    got = linear(many, w, rows=mixed)
    torch.testing.assert_close(got[[0, 1, 2, 7]], F.linear(many[[0, 1, 2, 7]], dense))
    assert torch.equal(got[3:7], w(many[3:7])) and torch.equal(got[8:], w(many)[8:])
    assert torch.equal(w(many)[:1], w(many[:1]))  # a row's result doesn't depend on the other rows


def test_fused_concat_is_the_concat_of_the_parts():
    a = Q4Linear(*q4_blocks(random_blocks(QT.Q4_1, 64, 64, 1), QT.Q4_1, (64, 64)))
    b = Q4Linear(*q4_blocks(random_blocks(QT.Q4_0, 32, 64, 2), QT.Q4_0, (32, 64)))
    both = Q4Linear.cat([a, b])
    assert both.shape == (96, 64)
    torch.testing.assert_close(both.dequantize(), torch.cat([a.dequantize(), b.dequantize()]))


def test_bad_shapes_and_formats_are_refused(tiny_llama_folder):
    with pytest.raises(ValueError, match="K % 32"):
        Q4Linear(torch.zeros(4, 40, dtype=torch.uint8), torch.ones(4, 1), torch.zeros(4, 1))
    with pytest.raises(ValueError, match="Q8_0"):
        q4_blocks(torch.zeros(4, 34, dtype=torch.uint8), QT.Q8_0, (4, 32))
    with pytest.raises(ValueError, match="safetensors folder"):
        Model.load(tiny_llama_folder, weights="q4")
    with pytest.raises(ValueError, match="weights must be"):
        Model.load(tiny_llama_folder, weights="int3")


def decode_logits(model, ids: torch.Tensor) -> torch.Tensor:
    """Teacher-forced logits, one token per forward (decode-sized matmuls)."""
    from tools.weight_quality import decode_logits as one_per_step

    return one_per_step(model, ids.reshape(-1).tolist())


@pytest.fixture(scope="module")
def models():
    return Model.load(weights="dense"), Model.load(weights="q4"), Model.load(weights="q8")


@pytest.fixture(scope="module")
def quality(models):
    """tools.weight_quality's text through each model, one token per step (the packed kernels' path)."""
    from tools.weight_quality import TEXT

    ids = Tokenizer.load().encode(TEXT)
    return ids, {m.weight_format: decode_logits(m, ids) for m in models}


@pytest.mark.parametrize("fmt", ["q4", "q8"])
def test_default_model_packed_is_smaller_and_agrees_with_dense(models, quality, fmt):
    from tools.weight_quality import compare

    dense, packed = models[0], models[1 if fmt == "q4" else 2]
    assert packed.weight_format == fmt and isinstance(packed.layers[0].gate_up, Q4Linear if fmt == "q4" else Q8Linear)
    assert isinstance(packed.lm_head, Q8Linear)  # the output head is 8-bit in both
    assert packed.decode_bytes() < (0.2 if fmt == "q4" else 0.3) * dense.decode_bytes()  # what a decode step reads
    assert packed.memory_bytes() > dense.memory_bytes()  # the dense copy for prefill is kept too
    ids, logits = quality
    r = compare(logits["dense"], logits[fmt])
    # int8 activations as llama.cpp's (its own figures on this text: 95.7 %, KL 3.2e-3, test below)
    assert r["top1_agreement"] >= 0.9 and r["kl_mean"] < 1e-2, r
    assert 0 < r["max_abs_logit_diff"] < 3.0, r  # really a different path, and a close one
    # prompt rows use the dense copies (layers and head): a whole-prompt forward gives the dense model's logits,
    # up to fp32 rounding (the fused norm and rotary kernels round differently from torch's)
    torch.testing.assert_close(packed.forward_tokens(ids), dense.forward_tokens(ids), rtol=1e-4, atol=2e-4)


def test_default_model_q4_is_as_close_to_dense_as_llama_cpp(models, quality):
    """The same GGUF through llama.cpp (int8 activations too) is the yardstick for q4's deviation."""
    pytest.importorskip("llama_cpp")
    from tools.weight_quality import compare, llamacpp_logits

    ids, logits = quality
    peer = compare(logits["dense"], llamacpp_logits(models[0].path, ids.reshape(-1).tolist(), models[0].vocab_size))
    ours = compare(logits["dense"], logits["q4"])
    assert peer["top1_agreement"] > 0.9  # llama.cpp really ran the same model
    assert ours["kl_mean"] < 1.5 * peer["kl_mean"], (ours, peer)
    assert ours["top1_agreement"] >= peer["top1_agreement"] - 0.03, (ours, peer)
    assert Model.load(weights="auto").weight_format == "q4"  # GGUF on a CPU


@pytest.mark.parametrize("fmt", ["q4", "q8"])
def test_default_model_packed_answers_paris(models, fmt):
    from tests.engine.test_model_peer import greedy_chat

    _, answer = greedy_chat(models[1 if fmt == "q4" else 2], "What is the capital of France?", 16)
    assert "Paris" in answer, answer


def test_q8_quantizes_a_safetensors_checkpoint_at_load(tiny_llama_folder):
    dense, q8 = Model.load(tiny_llama_folder, weights="dense"), Model.load(tiny_llama_folder, weights="q8")
    assert q8.weight_format == "q8" and isinstance(q8.layers[0].qkv, Q8Linear) and isinstance(q8.lm_head, Q8Linear)
    assert torch.equal(q8.layers[0].qkv.dense, dense.layers[0].qkv)  # prompt rows: the checkpoint's own weights
    err = (q8.layers[0].qkv.dequantize() - dense.layers[0].qkv).abs().max() / dense.layers[0].qkv.abs().max()
    assert 0 < err <= 0.5 / 127  # per-32 symmetric int8: at most half a step of the block's largest weight
    ids = torch.randint(10, 1000, (1, 24), generator=torch.Generator().manual_seed(0))
    a, b = decode_logits(dense, ids), decode_logits(q8, ids)
    assert ((a - b).norm() / a.norm()).item() < 1e-1  # int8 activations through random layers (flat logits)


@pytest.mark.parametrize("qtype", ["Q4_0", "Q4_1"])
def test_tiny_q4_gguf_q4_weights_follow_the_dense_path(tiny_llama_folder, tmp_path, qtype):
    """A Q4 GGUF written like llama.cpp (q/k rows permuted) loads packed and decodes close to its dense form."""
    from tests.tiny_models import write_tiny_gguf

    path = write_tiny_gguf(tiny_llama_folder, tmp_path / f"tiny-{qtype}.gguf", qtype)
    dense, q4 = Model.load(path, weights="dense"), Model.load(path, weights="auto")
    assert q4.weight_format == "q4" and isinstance(q4.layers[0].qkv, Q4Linear)
    torch.testing.assert_close(q4.layers[0].qkv.dequantize(), dense.layers[0].qkv)  # rows in HF order
    ids = torch.randint(10, 1000, (1, 24), generator=torch.Generator().manual_seed(0))
    a, b = decode_logits(dense, ids), decode_logits(q4, ids)
    assert ((a - b).norm() / a.norm()).item() < 5e-2  # bf16 inputs through random layers
    assert (a.argmax(-1) == b.argmax(-1)).float().mean().item() >= 0.9


def test_gguf_without_q4_matrices_loads_dense(tiny_llama_folder, tmp_path):
    from tests.tiny_models import write_tiny_gguf

    path = write_tiny_gguf(tiny_llama_folder, tmp_path / "tiny-f32.gguf", "F32")
    assert Model.load(path, weights="auto").weight_format == "dense"
