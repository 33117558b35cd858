"""Packed weights (weights="packed": a GGUF's blocks in the CPU kernels' q4/q8 formats; "q8": every matrix
int8 at load): faithful repacking of every GGUF type, close products, prompt rows through dense weights (a
kept copy or tiles), and the real model still right (vs dense, and as close as llama.cpp is)."""
import gguf
import pytest
import torch
import torch.nn.functional as F
from gguf import GGMLQuantizationType as QT

from engine import Model, Tokenizer
from engine.model import qlinear
from engine.model.packing import repack
from engine.model.qlinear import dense_weights
from engine.model.ggml_blocks import dequantize
from engine.model.qlinear import PartsLinear, Q4KLinear, Q4Linear, Q8Linear, RowSplit, cat_packed, linear
from tests.tiny_models import q4_k_m, write_tiny_gguf
from tools.ggml_writers import quantize as quantize_ggml
from tools.logits import forward_tokens

Q4_TYPES = [QT.Q4_0, QT.Q4_1, QT.Q4_K]
Q5_TYPES = [QT.Q5_0, QT.Q5_1]
Q8_TYPES = [QT.Q8_0, QT.Q5_K, QT.Q6_K]
EXACT = (QT.Q4_0, QT.Q4_1, QT.Q5_0, QT.Q5_1, QT.Q8_0, QT.Q6_K, QT.Q4_K, QT.Q5_K)


def quantized(qtype: QT, rows: int, cols: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(ggml bytes, their exact decode) of a random matrix with row-varying magnitudes."""
    g = torch.Generator().manual_seed(seed)
    src = torch.randn(rows, cols, generator=g) * torch.rand(rows, 1, generator=g) * 2
    raw = torch.from_numpy(quantize_ggml(src, qtype))
    return raw, dequantize(raw, qtype, (rows, cols))


@pytest.mark.parametrize("qtype", Q4_TYPES + Q5_TYPES + Q8_TYPES)
@pytest.mark.parametrize("keep_dense", [True, False])
def test_every_type_repacks_faithfully_and_multiplies_closely(qtype, keep_dense):
    """Q4_0/Q4_1/Q4_K/Q5_0/Q5_1/Q5_K/Q6_K/Q8_0 exactly; the rest through a Q8_0 re-quantization of the exact
    decode. Decode rows take the integer kernel, prompt rows the same
    weights in fp32 (a kept copy or tiles), embedding lookups the exact rows."""
    rows, cols = 200, 512
    raw, exact = quantized(qtype, rows, cols, int(qtype))
    w = repack.from_blocks(raw, qtype, (rows, cols), keep_dense=keep_dense)
    assert w.format == ("q4k" if qtype == QT.Q4_K else "q4" if qtype in Q4_TYPES else "q5" if qtype in Q5_TYPES
                        else "q6" if qtype == QT.Q6_K else "q5k" if qtype == QT.Q5_K else "q8")
    exact_kernel = qtype in EXACT
    assert w.prompt_dense == keep_dense
    # a format holding the file's weights exactly decodes them just in time; a re-quantized one keeps a copy
    assert (w.dense is not None) == (keep_dense and not exact_kernel) and w.jit_dense == (keep_dense and exact_kernel)
    dq = w.dequantize()
    err = ((dq - exact).abs().amax(1) / exact.abs().amax(1)).max().item()
    if qtype in EXACT:
        assert err == 0, err
    else:
        assert 0 < err <= 1 / 127, err  # half a Q8_0 step of the block's max, + its fp16 scale (subnormal in tiny rows)
    x = torch.randn(5, cols)
    y = w(x)
    assert y.shape == (5, rows) and y.dtype == torch.float32
    assert ((y - F.linear(x, dq)).norm() / y.norm()).item() < 2e-2  # int8 activations
    many = torch.randn(40, cols)
    prompt_w = exact if keep_dense else dq  # a kept copy is the file's exact weights; tiles decode the packed ones
    torch.testing.assert_close(linear(many, w, rows=RowSplit(torch.arange(40), 40)), F.linear(many, prompt_w))
    mixed = RowSplit(torch.tensor([0, 1, 2, 7]), 40)  # prompt rows dense, the rest packed, row by row
    got = linear(many, w, rows=mixed)
    torch.testing.assert_close(got[[0, 1, 2, 7]], F.linear(many[[0, 1, 2, 7]], prompt_w))
    assert torch.equal(got[3:7], w(many[3:7])) and torch.equal(got[8:], w(many)[8:])
    assert torch.equal(w(many)[:1], w(many[:1]))  # a row's result doesn't depend on the other rows
    ids = torch.tensor([3, 199, 3, 64])
    torch.testing.assert_close(w.embedding(ids), prompt_w[ids], atol=0, rtol=0)
    assert w.nbytes() == repack.packed_nbytes(w.format, (rows, cols))


def test_tiles_cover_matrices_taller_than_one_tile(monkeypatch):
    monkeypatch.setattr(dense_weights, "TILE_ROWS", 128)  # the tiles dense_product takes
    raw, _ = quantized(QT.Q4_K, 300, 256)
    w = repack.from_blocks(raw, QT.Q4_K, (300, 256), keep_dense=False)
    x = torch.randn(20, 256)
    torch.testing.assert_close(qlinear.dense_product(x, w), F.linear(x, w.dequantize()))


def test_q8_quantizes_like_gguf_and_keeps_the_checkpoint_for_prompts():
    """weights="q8": exactly the codes and scales the gguf package writes for Q8_0."""
    src = torch.randn(64, 256)
    expected = dequantize(torch.from_numpy(gguf.quants.quantize(src.numpy(), QT.Q8_0)), QT.Q8_0, (64, 256))
    w = Q8Linear.quantize(src)
    assert torch.equal(w.dequantize(), expected) and w.dense is not None and torch.equal(w.dense, src)
    assert Q8Linear.quantize(src, keep_dense=False).dense is None


def test_fused_parts_concatenate_and_mixed_formats_become_q8():
    def part(qtype, rows, seed):
        return repack.from_blocks(quantized(qtype, rows, 256, seed)[0], qtype, (rows, 256))

    a, b = part(QT.Q4_K, 64, 1), part(QT.Q4_1, 32, 2)
    both = cat_packed([a, b])
    assert isinstance(both, Q4Linear) and both.shape == (96, 256)
    # q4k beside q4 parts goes to q4 (fp16 sub-block scale products), as Q4_K was before q4k
    torch.testing.assert_close(both.dequantize(), torch.cat([a.to_q4().dequantize(), b.dequantize()]), atol=0, rtol=0)
    v = part(QT.Q6_K, 32, 3)  # a Q4_K_M layer's q|k|v
    mixed = cat_packed([a, v])
    assert isinstance(mixed, Q8Linear) and mixed.shape == (96, 256)
    exact = torch.cat([a.to_q4().dequantize(), v.dequantize()])  # mixed groups' q8 is q8 of q4 (the old bits)
    assert ((mixed.dequantize() - exact).abs().amax(1) <= exact.abs().amax(1) / 127).all()
    for second, expected in ((part(QT.Q4_1, 32, 2), both), (part(QT.Q6_K, 32, 3), mixed)):
        given_up = [part(QT.Q4_K, 64, 1), second]  # loading gives its parts up: emptied as they are copied
        fused = cat_packed(given_up, consume=True)
        assert type(fused) is type(expected) and torch.equal(fused.qs, expected.qs)
        assert torch.equal(fused.scale, expected.scale) and torch.equal(fused.dense, expected.dense)
        assert all(p.qs is None and p.dense is None for p in given_up if type(p) is type(fused))
    formats = repack.kernel_formats({"blk.0.attn_q.weight": "Q4_K", "blk.0.attn_k.weight": "Q4_K",
                                     "blk.0.attn_v.weight": "Q6_K", "blk.0.ffn_up.weight": "Q4_K",
                                     "blk.0.ffn_gate.weight": "Q4_K"}, "packed")
    assert formats == {"blk.0.attn_q.weight": "q8", "blk.0.attn_k.weight": "q8", "blk.0.attn_v.weight": "q8",
                       "blk.0.ffn_up.weight": "q4k", "blk.0.ffn_gate.weight": "q4k"}


def test_bad_shapes_and_formats_are_refused(tiny_llama_folder):
    with pytest.raises(ValueError, match="K % 32"):
        Q4Linear(torch.zeros(4, 40, dtype=torch.uint8), torch.ones(4, 1), torch.zeros(4, 1))
    with pytest.raises(ValueError, match="K % 32"):
        repack.from_blocks(torch.zeros(4, 34, dtype=torch.uint8), QT.Q8_0, (4, 40))
    with pytest.raises(ValueError, match="safetensors folder"):
        Model.load(tiny_llama_folder, weights="packed")
    with pytest.raises(ValueError, match="weights must be"):
        Model.load(tiny_llama_folder, weights="int3")


def test_the_dense_copy_rule_is_by_model_size():
    """The default 135M model's prompt rows take dense weights (its answer needs them: the Paris test below);
    a 270M Gemma-3-like file's take the int8 kernels, as every bigger model's do."""
    assert repack.keeps_dense_copy(135_000_000) and not repack.keeps_dense_copy(268_000_000)


def decode_logits(model, ids: torch.Tensor) -> torch.Tensor:
    """Teacher-forced logits, one token per forward (decode-sized matmuls)."""
    from tools.bench.weight_quality import decode_logits as one_per_step

    return one_per_step(model, ids.reshape(-1).tolist())


@pytest.fixture(scope="module")
def models():
    return Model.load(weights="dense"), Model.load(weights="packed"), Model.load(weights="q8")


@pytest.fixture(scope="module")
def quality(models):
    """tools.bench.weight_quality's text through each model, one token per step (the packed kernels' path)."""
    from tools.bench.weight_quality import TEXT

    ids = Tokenizer.load().encode(TEXT)
    return ids, {m.weight_format: decode_logits(m, ids) for m in models}


@pytest.mark.parametrize("fmt", ["packed", "q8"])
def test_default_model_packed_is_smaller_and_agrees_with_dense(models, quality, fmt, monkeypatch):
    from tools.bench.weight_quality import compare

    dense, packed = models[0], models[1 if fmt == "packed" else 2]
    assert packed.weight_format == fmt and isinstance(packed.layers[0].gate_up, Q4Linear if fmt == "packed" else Q8Linear)
    assert isinstance(packed.lm_head, Q8Linear) and packed.lm_head is packed.embed  # the tied Q8_0 table
    assert packed.decode_bytes() < (0.2 if fmt == "packed" else 0.3) * dense.decode_bytes()  # what a step reads
    if fmt == "packed":  # prompt rows decode the file's exact weights just in time: no dense copy kept
        assert packed.memory_bytes() < 0.2 * dense.memory_bytes() and packed.prompt_dense
    else:  # q8 re-quantizes the Q4_1 layers: their exact weights are kept for prompt rows
        assert packed.memory_bytes() > dense.memory_bytes()
    ids, logits = quality
    r = compare(logits["dense"], logits[fmt])
    # int8 activations as llama.cpp's (its own figures on this text: 95.7 %, KL 3.2e-3, test below)
    assert r["top1_agreement"] >= 0.9 and r["kl_mean"] < 1e-2, r
    assert 0 < r["max_abs_logit_diff"] < 3.0, r  # really a different path, and a close one
    # prompt rows use the dense copies (layers and head): a whole-prompt forward gives the dense model's logits,
    # up to fp32 rounding (the fused norm, rotary and attention kernels round differently from torch's), over
    # pools of the dense model's element type (a packed model's own are fp16: engine.cache.budget.pool_dtype)
    assert packed.kv_pool_dtype() == torch.float16
    monkeypatch.setattr(packed, "kv_pool_dtype", lambda: torch.float32)
    torch.testing.assert_close(forward_tokens(packed, ids), forward_tokens(dense, ids), rtol=1e-4, atol=2e-4)


def test_default_model_packed_is_as_close_to_dense_as_llama_cpp(models, quality):
    """The same GGUF through llama.cpp (int8 activations too) is the yardstick for the packed deviation."""
    pytest.importorskip("llama_cpp")
    from tools.bench.weight_quality import compare, llamacpp_logits

    ids, logits = quality
    peer = compare(logits["dense"], llamacpp_logits(models[0].path, ids.reshape(-1).tolist(), models[0].vocab_size))
    ours = compare(logits["dense"], logits["packed"])
    assert peer["top1_agreement"] > 0.9  # llama.cpp really ran the same model
    assert ours["kl_mean"] < 1.5 * peer["kl_mean"], (ours, peer)
    assert ours["top1_agreement"] >= peer["top1_agreement"] - 0.03, (ours, peer)
    assert Model.load(weights="auto").weight_format == "packed"  # GGUF on a CPU
    assert Model.load(weights="q4").weight_format == "packed"  # the older name


@pytest.mark.parametrize("fmt", ["packed", "q8"])
def test_default_model_packed_answers_paris(models, fmt):
    from tests.engine.test_model_peer import greedy_chat

    _, answer = greedy_chat(models[1 if fmt == "packed" else 2], "What is the capital of France?", 16)
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


@pytest.fixture(scope="module")
def wide_llama_folder(tmp_path_factory):
    """A tiny untied llama whose rows are multiples of 256 (K-quant super-blocks): hidden 256, MLP 512."""
    from tests.tiny_models import write_tiny_model

    return write_tiny_model(tmp_path_factory.mktemp("wide") / "llama", "llama", tie=False, hidden_size=256,
                            intermediate_size=512, head_dim=64, seed=3)


@pytest.mark.parametrize("qtype", ["Q4_0", "Q4_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K", "Q4_K_M"])
def test_tiny_gguf_of_each_type_follows_its_dense_form(wide_llama_folder, tmp_path, qtype, monkeypatch):
    """A GGUF written like llama.cpp (q/k rows permuted) loads packed and decodes close to its dense form;
    Q4_K_M mixes Q4_K and Q6_K inside fused projections and packs the output head too. Loaded as a big
    model would be (no dense copy): prompt rows through the packed kernels, the embedding from the file's rows."""
    monkeypatch.setattr(repack, "DENSE_COPY_MAX_BYTES", 0)
    path = write_tiny_gguf(wide_llama_folder, tmp_path / f"tiny-{qtype}.gguf", q4_k_m if qtype == "Q4_K_M" else qtype)
    dense, q = Model.load(path, weights="dense"), Model.load(path, weights="auto")
    assert q.wait_settled(60)  # the layers as settled (a model this size starts on the file's rows)
    assert q.weight_format == "packed" and q.layers[0].qkv.dense is None and q.embed.dense is None
    torch.testing.assert_close(q.layers[0].qkv.dequantize(), dense.layers[0].qkv, atol=0.02, rtol=0.01)  # HF row order
    if qtype == "Q4_K_M":
        assert isinstance(q.layers[1].qkv, PartsLinear) and isinstance(q.layers[1].gate_up, Q4KLinear)  # v: Q6_K
    ids = torch.randint(10, 1000, (1, 24), generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(q.embed.embedding(ids), F.embedding(ids, dense.embed), atol=0, rtol=0)
    a, b = decode_logits(dense, ids), decode_logits(q, ids)
    # int8 activations through random (chaotic, ~15x amplifying) layers; Q5_K is re-quantized as Q8_0 on top
    assert ((a - b).norm() / a.norm()).item() < (0.15 if qtype in ("Q6_K", "Q4_K_M", "Q5_K") else 0.1)
    # random tiny models have many near-ties among 49k logits, so top-1 agreement is a loose check here
    assert (a.argmax(-1) == b.argmax(-1)).float().mean().item() >= 0.7
    # prompt rows: no dense copy, so the packed kernels like generated rows (dense tiles decoded every weight
    # per chunk): a one-pass forward gives the token-by-token logits, up to the attention path's rounding
    # amplified by the random layers (dense prompt rows were 0.05-0.15 away from them)
    p, d = forward_tokens(q, ids), forward_tokens(dense, ids)
    assert ((p - b).norm() / b.norm()).item() < 0.01
    assert ((p - d).norm() / d.norm()).item() < (0.15 if qtype in ("Q6_K", "Q4_K_M", "Q5_K") else 0.1)


def test_gguf_without_quantized_matrices_loads_dense(tiny_llama_folder, tmp_path):
    path = write_tiny_gguf(tiny_llama_folder, tmp_path / "tiny-f32.gguf", "F32")
    assert Model.load(path, weights="auto").weight_format == "dense"
