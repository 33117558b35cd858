"""Packed weights (weights="packed"/"q8", engine.packed + engine.qlinear): every GGUF type repacked
faithfully, decode products close, prompt rows through dense tiles, and whole models still right."""
import gguf
import pytest
import torch
import torch.nn.functional as F
from gguf import GGMLQuantizationType as QT

from engine import Model, Tokenizer
from engine.model import packed
from engine.cache.paged_cache import PagedCache
from engine.model.packed import PackedGroup, PackedLinear
from engine.model.qlinear import RowSplit, linear
from engine.model.ggml_blocks import dequantize
from engine.model.ggml_blocks import quantize as quantize_ggml
from tests.tiny_models import q4_k_m, write_tiny_gguf

PLANE_TYPES = [QT.Q4_0, QT.Q4_1, QT.Q8_0, QT.Q4_K, QT.Q5_K]
INT8_TYPES = [QT.Q6_K, QT.Q5_0, QT.Q5_1]


def test_int4_layout_matches_what_unpacking_assumes():
    """The dense tiles unpack torch's CPU int4 layout (a torch internal): checked against the packer."""
    assert packed.layout_ok()


def blocks_with_bf16_exact_scales(qtype: QT, rows: int, cols: int, seed: int = 0) -> torch.Tensor:
    """Random codes in every position, with scales and mins chosen so that scale, zero and 16*scale are
    exact in bf16: then a faithful repack reproduces the exact decode bit for bit."""
    g = torch.Generator().manual_seed(seed)
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    b = torch.randint(0, 256, (rows * cols // block, size), generator=g, dtype=torch.uint8)
    two = torch.tensor([2.0 ** -6], dtype=torch.float16).view(torch.uint8)
    if qtype in (QT.Q4_0, QT.Q8_0, QT.Q4_1):
        b[:, 0:2] = two
        if qtype == QT.Q4_1:
            b[:, 2:4] = torch.tensor([-5 * 2.0 ** -6], dtype=torch.float16).view(torch.uint8)
    else:  # K-quants: d = dmin = 2^-6, 6-bit scales and mins below 16
        b[:, 0:2] = two
        b[:, 2:4] = two
        b[:, 4:16] &= 0x0F
    return b.reshape(rows, -1)


@pytest.mark.parametrize("qtype", PLANE_TYPES)
def test_plane_types_repack_exactly(qtype):
    rows, cols = 96, 512
    raw = blocks_with_bf16_exact_scales(qtype, rows, cols)
    exact = dequantize(raw, qtype, (rows, cols))
    w = PackedLinear.from_blocks(raw, qtype, (rows, cols))
    assert len(w.planes) == packed.PLANE_COUNT[qtype]
    assert torch.equal(w.dequantize(), exact)
    assert w.nbytes() == packed.packed_nbytes(qtype.name, (rows, cols), "packed")


@pytest.mark.parametrize("qtype", PLANE_TYPES + INT8_TYPES)
def test_every_type_packs_close_and_multiplies_closely(qtype):
    """Real quantizations of random matrices: the packed weights are the exact decode up to bf16 scales
    (plane types) or a Q8_0 re-quantization (the rest); decode and prompt paths agree with them."""
    rows, cols = 200, 512  # rows not a multiple of 64: the padded tail must not leak into the output
    torch.manual_seed(int(qtype))
    src = torch.randn(rows, cols) * torch.rand(rows, 1) * 2
    raw = torch.from_numpy(quantize_ggml(src, qtype))
    exact = dequantize(raw, qtype, (rows, cols))
    w = PackedLinear.from_blocks(raw, qtype, (rows, cols))
    dq = w.dequantize()
    tol = 6e-3 if qtype in PLANE_TYPES else 1e-2  # of a row's largest weight: bf16 scales; Q8_0 steps (the rest)
    assert ((dq - exact).abs().amax(1) <= tol * exact.abs().amax(1)).all()
    x = torch.randn(5, cols)
    y = w(x)
    assert y.shape == (5, rows) and y.dtype == torch.float32
    assert ((y - F.linear(x, dq)).norm() / y.norm()).item() < 1e-2  # int4 kernel: bf16 activations
    torch.testing.assert_close(w.linear_tiled(x), F.linear(x, dq))  # prompt rows: fp32 tiles of the same weights
    torch.testing.assert_close(w.embedding(torch.tensor([3, 199, 3, 64])), dq[[3, 199, 3, 64]])
    many = torch.randn(40, cols)
    assert torch.equal(w(many)[:1], w(many[:1]))  # a row's result doesn't depend on the other rows
    assert w.nbytes() == packed.packed_nbytes(qtype.name, (rows, cols), "packed")


@pytest.mark.parametrize("qtype", [QT.Q8_0, QT.Q4_K, QT.Q6_K])
def test_embedding_and_head_rows_keep_fp32_activations(qtype):
    """The output head and embedding table: int8 per row of the exact decode, multiplied in fp32 (the
    int4 kernel's bf16 activations flipped the default model's answer)."""
    rows, cols = 100, 512
    raw = torch.from_numpy(quantize_ggml(torch.randn(rows, cols), qtype))
    exact = dequantize(raw, qtype, (rows, cols))
    w = PackedLinear.from_blocks(raw, qtype, (rows, cols), rows_int8=True)
    dq = w.dequantize()
    assert w.int8 is not None and ((dq - exact).abs().amax(1) <= exact.abs().amax(1) / 254 + 1e-7).all()
    x = torch.randn(3, cols)
    torch.testing.assert_close(w(x), F.linear(x, dq), atol=1e-4, rtol=1e-4)  # fp32, not bf16
    assert torch.equal(w.embedding(torch.tensor([5, 99, 5])), exact[[5, 99, 5]])  # lookups: the file's exact rows
    assert w.nbytes() == packed.packed_nbytes(qtype.name, (rows, cols), "packed", "output.weight")


def test_tiles_cover_matrices_taller_than_one_tile(monkeypatch):
    monkeypatch.setattr(packed, "TILE_ROWS", 128)
    raw = torch.from_numpy(quantize_ggml(torch.randn(300, 256), QT.Q4_K))
    w = PackedLinear.from_blocks(raw, QT.Q4_K, (300, 256))
    x = torch.randn(3, 256)
    torch.testing.assert_close(w.linear_tiled(x), F.linear(x, w.dequantize()))


def test_q8_quantizes_dense_matrices_like_gguf():
    """weights="q8": Q8_0 exactly as the gguf package quantizes it, then packed."""
    src = torch.randn(64, 256)
    expected = dequantize(torch.from_numpy(gguf.quants.quantize(src.numpy(), QT.Q8_0)), QT.Q8_0, (64, 256))
    w = PackedLinear.from_dense(src)
    assert ((w.dequantize() - expected).abs().amax(1) <= 4e-3 * expected.abs().amax(1)).all()


def test_stacking_fuses_matching_layouts_into_one_matrix():
    parts = [PackedLinear.from_blocks(torch.from_numpy(quantize_ggml(torch.randn(n, 128), t)), t, (n, 128))
             for n, t in ((128, QT.Q4_K), (64, QT.Q4_0))]
    fused = packed.stack(parts)
    assert isinstance(fused, PackedLinear) and fused.shape == (192, 128)
    x = torch.randn(3, 128)
    torch.testing.assert_close(fused(x), torch.cat([p(x) for p in parts], dim=1))
    torch.testing.assert_close(fused.dequantize(), torch.cat([p.dequantize() for p in parts]))
    odd = PackedLinear.from_blocks(torch.from_numpy(quantize_ggml(torch.randn(48, 128), QT.Q4_K)), QT.Q4_K, (48, 128))
    assert isinstance(packed.stack([odd, parts[0]]), PackedGroup)  # padded rows would land mid-matrix


def test_rows_split_by_sequence_and_groups_of_mixed_types():
    a = PackedLinear.from_blocks(torch.from_numpy(quantize_ggml(torch.randn(64, 128), QT.Q4_K)), QT.Q4_K, (64, 128))
    b = PackedLinear.from_blocks(torch.from_numpy(quantize_ggml(torch.randn(32, 128), QT.Q6_K)), QT.Q6_K, (32, 128))
    both = PackedGroup([a, b])  # a Q4_K_M layer's q|k|v: Q4_K and Q6_K in one fused projection
    dense = torch.cat([a.dequantize(), b.dequantize()])
    torch.testing.assert_close(both.dequantize(), dense)
    many = torch.randn(40, 128)
    torch.testing.assert_close(linear(many, both, rows=RowSplit(torch.arange(40), 40)), F.linear(many, dense))
    mixed = RowSplit(torch.tensor([0, 1, 2, 7]), 40)  # prompt rows dense, the rest packed, row by row
    got = linear(many, both, rows=mixed)
    torch.testing.assert_close(got[[0, 1, 2, 7]], F.linear(many[[0, 1, 2, 7]], dense))
    assert torch.equal(got[3:7], both(many[3:7])) and torch.equal(got[8:], both(many)[8:])


def test_bad_formats_are_refused(tiny_llama_folder):
    with pytest.raises(ValueError, match="K % 32"):
        PackedLinear.from_blocks(torch.zeros(4, 34, dtype=torch.uint8), QT.Q8_0, (4, 40))
    with pytest.raises(ValueError, match="safetensors folder"):
        Model.load(tiny_llama_folder, weights="packed")
    with pytest.raises(ValueError, match="weights must be"):
        Model.load(tiny_llama_folder, weights="int3")


def decode_logits(model, ids: torch.Tensor) -> torch.Tensor:
    """Teacher-forced logits, one token per forward (decode-sized matmuls)."""
    from engine.model.batch import Batch

    cache = PagedCache(model, max_tokens=256, page_size=256)
    rows = [model.forward(Batch.build([([t], pos, [0])], 256, [1]), cache)[0, : model.vocab_size]
            for pos, t in enumerate(ids.reshape(-1).tolist())]
    return torch.stack(rows)


@pytest.fixture(scope="module")
def models():
    return Model.load(weights="dense"), Model.load(weights="packed")


def test_default_model_packed_is_smaller_and_agrees_with_dense(models):
    dense, q = models
    assert q.weight_format == "packed" and isinstance(q.layers[0].gate_up, PackedLinear)
    assert isinstance(q.embed, PackedLinear) and q.lm_head is q.embed  # tied Q8_0 table, packed too
    assert q.memory_bytes() < 0.25 * dense.memory_bytes() and q.decode_bytes() == q.memory_bytes()
    tok = Tokenizer.load()
    ids = tok.encode("The history of the printing press begins in the fifteenth century, when Johannes "
                     "Gutenberg combined movable metal type, oil-based inks and a wooden press. Within fifty "
                     "years printing shops had spread across Europe and the cost of books fell sharply.")
    a, b = decode_logits(dense, ids), decode_logits(q, ids)  # one token per step: the packed kernels' path
    agree = (a.argmax(-1) == b.argmax(-1)).float().mean().item()
    assert agree >= 0.95, agree
    assert 0 < (a - b).abs().max() < 2.0  # really a different path, and a close one
    # prompt rows: fp32 tiles of the packed weights, close to the exact dense model
    p = q.forward_tokens(ids)
    assert (p.argmax(-1) == dense.forward_tokens(ids).argmax(-1)).float().mean().item() >= 0.95
    assert Model.load(weights="auto").weight_format == "packed"  # GGUF on a CPU
    assert Model.load(weights="q4").weight_format == "packed"  # the older name


def test_default_model_packed_answers_paris(models):
    from tests.engine.test_model_peer import greedy_chat

    _, answer = greedy_chat(models[1], "What is the capital of France?", 16)
    assert "Paris" in answer, answer


@pytest.fixture(scope="module")
def wide_llama_folder(tmp_path_factory):
    """A tiny untied llama whose rows are multiples of 256 (K-quant super-blocks): hidden 256, MLP 512."""
    from tests.tiny_models import write_tiny_model

    return write_tiny_model(tmp_path_factory.mktemp("wide") / "llama", "llama", tie=False, hidden_size=256,
                            intermediate_size=512, head_dim=64, seed=3)


@pytest.mark.parametrize("qtype", ["Q4_0", "Q4_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K", "Q4_K_M"])
def test_tiny_gguf_of_each_type_follows_its_dense_form(wide_llama_folder, tmp_path, qtype):
    """A GGUF written like llama.cpp (q/k rows permuted) loads packed and decodes close to its dense form;
    Q4_K_M mixes Q4_K and Q6_K inside fused projections and packs the output head too."""
    path = write_tiny_gguf(wide_llama_folder, tmp_path / f"tiny-{qtype}.gguf", q4_k_m if qtype == "Q4_K_M" else qtype)
    dense, q = Model.load(path, weights="dense"), Model.load(path, weights="auto")
    assert q.weight_format == "packed"
    torch.testing.assert_close(q.layers[0].qkv.dequantize(), dense.layers[0].qkv, atol=0.02, rtol=0.01)  # HF row order
    if qtype == "Q4_K_M":
        assert isinstance(q.layers[1].qkv, PackedGroup) and isinstance(q.lm_head, PackedLinear)  # v: Q6_K
    ids = torch.randint(10, 1000, (1, 24), generator=torch.Generator().manual_seed(0))
    a, b = decode_logits(dense, ids), decode_logits(q, ids)
    # bf16 inputs through random (chaotic, ~15x amplifying) layers; Q6_K is re-quantized as Q8_0 on top
    assert ((a - b).norm() / a.norm()).item() < (0.1 if qtype in ("Q6_K", "Q4_K_M") else 5e-2)
    # random tiny models have many near-ties among 49k logits, so top-1 agreement is a loose check here
    assert (a.argmax(-1) == b.argmax(-1)).float().mean().item() >= 0.75


def test_q8_loads_hf_folders_quantized(tiny_llama_folder):
    dense, q8 = Model.load(tiny_llama_folder, weights="dense"), Model.load(tiny_llama_folder, weights="q8")
    assert q8.weight_format == "q8" and isinstance(q8.layers[1].down, PackedLinear)
    assert q8.memory_bytes() < 0.45 * dense.memory_bytes()
    ids = torch.randint(10, 1000, (1, 24), generator=torch.Generator().manual_seed(1))
    a, b = decode_logits(dense, ids), decode_logits(q8, ids)
    assert ((a - b).norm() / a.norm()).item() < 5e-2  # Q8_0 and bf16 inputs through random layers
    assert (a.argmax(-1) == b.argmax(-1)).float().mean().item() >= 0.75


def test_gguf_without_quantized_matrices_loads_dense(tiny_llama_folder, tmp_path):
    path = write_tiny_gguf(tiny_llama_folder, tmp_path / "tiny-f32.gguf", "F32")
    assert Model.load(path, weights="auto").weight_format == "dense"
