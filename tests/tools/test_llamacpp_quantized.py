"""tools.models.synthetic_gguf --quantize: a random model written F16 and quantized by llama.cpp's own
quantizer holds llama.cpp's per-layer Q4_K_M mix (Q6_K attn_v / ffn_down in the layers its use_more_bits rule
picks, Q4_K in the rest, a Q6_K head), and pagedeck's logits on it match llama.cpp's within the fidelity
suite's bounds for quantized files (tests/engine/test_fidelity_llamacpp.py), in both weight formats.

The file is a Qwen 2 (q/k/v biases) of 4 layers with rows of 256 (so the K-quants need no fallback) and the
embedded SmolLM2 vocabulary (49,152 real byte-level BPE tokens and merges); its std spreads the tiny model's
logits so that near-ties do not hide a wrong decode. llama.cpp runs in subprocesses (the tool's command and
tests.oracles.llamacpp_peer), as the fidelity suite runs it.
"""
from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from tests.engine.test_fidelity_llamacpp import BOUNDS
from tests.llamacpp_fidelity import FORMATS, kl, pagedeck_logits, sequence

LAYERS = 4
MORE_BITS = {2, 3}  # llama.cpp's use_more_bits for 4 layers: the last eighth, every third from the first eighth


@pytest.fixture(scope="module")
def quantized(tmp_path_factory):
    pytest.importorskip("llama_cpp")
    from tests.oracles.llamacpp_peer import ROOT, run_jobs

    folder = tmp_path_factory.mktemp("llamacpp_recipe")
    path = folder / "qwen2-Q4_K_M.gguf"
    subprocess.run([sys.executable, "-m", "tools.models.synthetic_gguf", str(path), "--shape", "tiny-256", "--arch",
                    "qwen2", "--layers", str(LAYERS), "--quantize", "Q4_K_M", "--std", "0.125"],
                   cwd=ROOT, check=True, capture_output=True, timeout=600)
    ids = sequence(49152)
    out = folder / "logits.npy"
    (result,) = run_jobs([{"op": "logits", "model": str(path), "ids": ids, "out": str(out)}], folder)
    assert result["ok"], result
    import numpy as np

    return path, ids, torch.from_numpy(np.load(out))


def test_the_file_holds_llama_cpps_per_layer_mix(quantized):
    from tools.models._llamacpp_quantized import tensor_types

    path, _, _ = quantized
    types = tensor_types(path)
    assert not any(t.endswith(".F16.gguf") for t in map(str, path.parent.iterdir()))  # the source is deleted
    assert types["output.weight"] == "Q6_K" and types["token_embd.weight"] == "Q4_K"
    for kind in ("attn_v.weight", "ffn_down.weight"):
        assert {i for i in range(LAYERS) if types[f"blk.{i}.{kind}"] == "Q6_K"} == MORE_BITS, kind
        assert {types[f"blk.{i}.{kind}"] for i in set(range(LAYERS)) - MORE_BITS} == {"Q4_K"}, kind
    assert {types[f"blk.{i}.attn_q.weight"] for i in range(LAYERS)} == {"Q4_K"}
    assert {types[f"blk.{i}.attn_{p}.bias"] for i in range(LAYERS) for p in "qkv"} == {"F32"}


@pytest.mark.parametrize("fmt", FORMATS)
def test_pagedeck_gives_llama_cpps_logits_on_it(quantized, fmt):
    path, ids, theirs = quantized
    ours = pagedeck_logits(path, ids, fmt)
    kl_mean, kl_pos, regret, top1 = BOUNDS["quantized"]
    d = kl(theirs, ours)
    picked = ours.argmax(-1)
    assert d.mean() < kl_mean and d.max() < kl_pos, (d.mean(), d.max())
    assert (theirs.max(-1).values - theirs.gather(-1, picked[:, None])[:, 0]).max() < regret
    assert (theirs.argmax(-1) == picked).float().mean() >= top1


def test_a_wrong_q6_k_decode_on_the_mixed_layers_is_caught(quantized, monkeypatch):
    """The comparison has teeth on this file: Q6_K's sub-block scales read in reverse order (the Q6_K layers
    only, a third of attn_v / ffn_down and the head) move the KL far past the bound."""
    from gguf import GGMLQuantizationType as Q

    from engine.model import ggml_blocks

    def reversed_scales(b, out):
        q, s = ggml_blocks.q6_k_affine(b)
        torch.mul(s.flip(1), q.float(), out=out.view(-1, 16, 16))

    path, ids, theirs = quantized
    monkeypatch.setitem(ggml_blocks._FAST, Q.Q6_K, reversed_scales)
    assert kl(theirs, pagedeck_logits(path, ids, "dense")).mean() > 5 * BOUNDS["quantized"][0]
