"""The gpt-oss-20b preset of tools.models._llamacpp_quantized at a tiny size: llama.cpp's quantizer takes its
F16 source under the MXFP4_MOE recipe (MXFP4 expert stacks, Q8_0 for the other matrices but the router,
which llama.cpp never quantizes, F32 biases, sinks and norms), and pagedeck's gpt-oss loader reads every
tensor the preset writes as the feature it is (sinks, q/k/v/o biases, router and expert biases, alternating
sliding layers, YaRN) in both weight formats. The full-size file's comparison with llama.cpp's logits is
`python -m tools.bench.moe_bench check gptoss-smoke`.
"""
from __future__ import annotations

import pytest
import torch

TINY = dict(layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_experts=4,
            experts_per_token=2, intermediate_size=32, moe_intermediate_size=32, vocab=49152, tokenizer="smollm2")


@pytest.fixture(scope="module")
def quantized(tmp_path_factory):
    pytest.importorskip("llama_cpp")
    from tools.models._llamacpp_quantized import PRESETS, write_quantized_gguf
    from tools.models.synthetic_gguf import smollm2_tokenizer

    p = {**PRESETS["gpt-oss-20b"], **TINY}
    path = tmp_path_factory.mktemp("gpt_oss_preset") / "gpt-oss-MXFP4_MOE.gguf"
    return p, write_quantized_gguf(path, p, "MXFP4_MOE", add_tokenizer=smollm2_tokenizer(p["vocab"]), threads=1)


def test_the_file_holds_the_mxfp4_moe_mix(quantized):
    from tools.models._llamacpp_quantized import tensor_specs, tensor_types

    p, path = quantized
    types = tensor_types(path)
    assert set(types) == {name for name, _ in tensor_specs(p)}
    for name, qtype in types.items():
        kind = name.split(".", 2)[2] if name.startswith("blk.") else name
        want = ("MXFP4" if "_exps.weight" in kind else "F16" if kind == "ffn_gate_inp.weight"
                else "F32" if kind.endswith(".bias") or "norm" in kind or "sinks" in kind else "Q8_0")
        assert qtype == want, name


@pytest.mark.parametrize("weights", ["dense", "packed"])
def test_pagedeck_reads_every_gpt_oss_feature(quantized, weights):
    from engine import Model
    from tools.logits import forward_tokens

    p, path = quantized
    model = Model.load(path, device="cpu", dtype=torch.float32, weights=weights)
    c = model.config
    assert c.arch == "gpt-oss" and c.attention_sinks and c.attention_bias and c.output_bias
    assert c.router_bias and c.expert_bias and c.num_experts == TINY["num_experts"]
    assert c.layer_types == ["sliding_attention", "full_attention"] and c.sliding_window == 128
    assert c.rope_scaling["rope_type"] == "yarn" and c.rope_scaling["factor"] == 32.0
    sinks = torch.stack([layer.sinks for layer in model.layers])
    assert sinks.shape == (TINY["layers"], TINY["num_attention_heads"]) and sinks.std() > 0.1  # drawn, not ones
    assert torch.isfinite(forward_tokens(model, torch.arange(1, 40))).all()
