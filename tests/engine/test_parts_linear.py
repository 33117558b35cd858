"""Fused groups of mixed formats (a Q4_K_M file's Q4_K q and k beside its Q6_K v) kept part by part
(qlinear.PartsLinear) where prompt rows take the packed kernels: each part's own output, joined; the
one-call decode (kernels.decode_layers) gives the per-layer path's bits (which a model without dense prompt
rows once missed: its per-layer path took the reference norm); the group holds the file's bytes."""

import pytest
import torch
from gguf import GGMLQuantizationType as QT

import kernels
from engine import Model
from engine.cache.paged_cache import PagedCache
from engine.model.packing import repack
from engine.model.batch import Batch
from engine.model.qlinear import PartsLinear, Q4KLinear, Q6Linear, Q8Linear, cat_packed
from kernels import cpu_ext
from tools.ggml_writers import quantize as quantize_ggml
from tools.models.synthetic_gguf import write_random_gguf

pytestmark = pytest.mark.skipif(not cpu_ext.available(), reason="pagedeck's CPU kernels did not build here")


def part(qtype: QT, rows: int, k: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    raw = torch.from_numpy(quantize_ggml(torch.randn(rows, k, generator=g), qtype))
    return repack.from_blocks(raw, qtype, (rows, k), keep_dense=False)


def test_each_part_multiplies_in_its_own_format():
    q, k, v = part(QT.Q4_K, 64, 512, 1), part(QT.Q4_K, 32, 512, 2), part(QT.Q6_K, 32, 512, 3)
    qkv = cat_packed([q, k, v])
    assert isinstance(qkv, PartsLinear) and qkv.shape == (128, 512)
    assert [type(p) for p in qkv.parts] == [Q4KLinear, Q4KLinear, Q6Linear]
    assert qkv.nbytes() == q.nbytes() + k.nbytes() + v.nbytes()  # the file's bytes, not q8's ~1.8x
    assert qkv.nbytes() < Q8Linear.cat([Q8Linear.requantize(p) for p in (q, k, v)]).nbytes()
    x = torch.randn(5, 512)
    assert torch.equal(qkv(x), torch.cat([q(x), k(x), v(x)], dim=1))
    assert torch.equal(qkv(x[None])[0], qkv(x))
    assert torch.equal(qkv.dequantize(), torch.cat([q.dequantize(), k.dequantize(), v.dequantize()]))
    assert torch.equal(qkv.dense_rows(50, 100), qkv.dequantize()[50:100])
    gate_up = cat_packed([part(QT.Q4_K, 32, 512, 4), part(QT.Q6_K, 32, 512, 5)])
    # SwiGLU as the fused kernel's epilogue computes it (its bits), within rounding of torch's silu
    assert torch.equal(gate_up(x, act="swiglu"), cpu_ext.ops().silu_mul(gate_up(x)))
    torch.testing.assert_close(gate_up(x, act="swiglu"), kernels.silu_mul(gate_up(x)), rtol=1e-5, atol=1e-6)


def test_parts_keeping_dense_prompt_rows_still_become_one_format():
    q = repack.from_blocks(torch.from_numpy(quantize_ggml(torch.randn(32, 256), QT.Q4_K)), QT.Q4_K, (32, 256))
    v = repack.from_blocks(torch.from_numpy(quantize_ggml(torch.randn(32, 256), QT.Q6_K)), QT.Q6_K, (32, 256))
    assert q.prompt_dense and isinstance(cat_packed([q, v]), Q8Linear)
    with pytest.raises(ValueError, match="dense prompt rows"):
        PartsLinear([q, v])


@pytest.fixture(scope="module", params=["Q4_K_M", "Q4_0", "qwen2-Q4_K_M", "qwen3-Q4_K_M", "gemma2-Q4_K_M",
                                        "gemma3-Q4_K_M"])
def path(tmp_path_factory, request):
    folder = tmp_path_factory.mktemp(f"parts-{request.param}")
    # q|k|v biases (Qwen2) or q/k norms (Qwen3); 2 layers, layer 1's q|k|v mixed. Gemma: sandwich norms, GeGLU,
    # sliding windows (shorter than the test's context), soft caps (2), q/k norms and the sliding layers' own
    # rotary base (3)
    if request.param.startswith(("qwen", "gemma")):
        from tests.tiny_models import WIDE, q4_k_m, write_tiny_gguf, write_tiny_model

        arch = request.param.split("-")[0]
        hf = write_tiny_model(folder / "hf", arch, tie=arch.startswith("gemma"), tokenizer=False, vocab_size=512,
                              weight_std=0.125, **WIDE)
        return write_tiny_gguf(hf, folder / f"{arch}.gguf", q4_k_m, tokenizer=False)
    # 8 layers of llama.cpp's Q4_K_M recipe: attn_v is Q6_K in layers 0, 3, 6 and 7 (mixed q|k|v)
    return write_random_gguf(folder / "m.gguf", "tiny-256", 8, request.param)


def test_one_call_decode_gives_the_per_layer_bits(path, monkeypatch):
    monkeypatch.setenv("PAGEDECK_DENSE_COPY", "0")  # prompt rows packed, as in a model too big for the copy
    model = Model.load(path, weights="packed")
    assert model.wait_settled(60)  # the layers as settled, not the file's rows the model starts on
    mixed = [isinstance(layer.qkv, PartsLinear) for layer in model.layers]
    if path.name == "qwen2.gguf":  # the biases go into the one call too
        assert mixed == [False, True] and all(layer.qkv_bias is not None for layer in model.layers)
    elif path.name == "qwen3.gguf":  # and the per-head q/k norms
        assert mixed == [False, True] and all(layer.q_norm is not None for layer in model.layers)
    elif path.name.startswith("gemma"):  # and the sandwich norms, windows, soft caps, the sliding layers' rotary
        assert all(layer.attn_out_norm is not None and layer.mlp_out_norm is not None for layer in model.layers)
        assert any(layer.window for layer in model.layers) and any(not layer.window for layer in model.layers)
        assert model.config.hidden_act == "gelu_tanh"
        if path.name == "gemma3.gguf":
            assert any(layer.sliding_rope for layer in model.layers) and model.config.attn_softcap is None
        else:
            assert model.config.attn_softcap
    else:
        assert mixed == ([i in (0, 3, 6, 7) for i in range(8)] if "Q4_K_M" in str(path) else [False] * 8)
    stack, parts, ids = model.decode_stack
    assert parts == [n for m in mixed for n in ([3, 1, 1, 1] if m else [1, 1, 1, 1])]

    calls = []
    real = kernels.decode_layers
    monkeypatch.setattr(kernels, "decode_layers", lambda *a, **k: calls.append(1) or real(*a, **k))

    def decode(one_call: bool) -> list[torch.Tensor]:
        if not one_call:
            model.decode_stack = None
        cache, ids, out = PagedCache(model, max_tokens=64, page_size=16), list(range(3, 30)), []  # past windows of 16
        model.forward(Batch.build([(ids, 0, [0, 1])], 16, [len(ids)]), cache)
        for step in range(4):
            at = len(ids) + step
            out.append(model.forward(Batch.build([([20 + step], at, [0, 1])], 16, [1], prompt_seqs=[False]),
                                     cache))
        return out

    one = decode(True)
    assert len(calls) == 4, "the steps did not take the one-call decode"
    per_layer = decode(False)
    assert len(calls) == 4
    model.decode_stack = (stack, parts, ids)
    assert all(torch.equal(a, b) for a, b in zip(one, per_layer))
    if mixed[0]:  # a stack whose counts miss the parts: refused, not misread
        model.decode_stack = (stack, [1] * len(parts), ids)
        with pytest.raises(RuntimeError, match="do not match the part counts"):
            decode(True)
    model.decode_stack = (stack, parts, ids[:-1])  # a part without its format id: refused
    with pytest.raises(RuntimeError, match="one format id per part"):
        decode(True)
