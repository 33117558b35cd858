"""Weight loading: safetensors folders and GGUF files against transformers and the gguf package."""

import json
import math

import gguf
import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from engine.model.config import ModelConfig
from engine.model.ggml_blocks import dequantize
from engine.model.weights import GGUFFile, default_model_path, expected_tensor_names, load_weights
from tests.tiny_models import (ARCHS, GEMMAS, LLAMA3_ROPE, hf_default_model, tiny_config, write_tiny_gguf,
                                write_tiny_model)
from tools.ggml_writers import quantize as quantize_ggml

Q = gguf.GGMLQuantizationType


def hf_state(folder):
    return {k: v for f in sorted(folder.glob("*.safetensors")) for k, v in load_file(f).items()}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """One untied tiny llama folder shared by the error tests (copied before being damaged)."""
    return write_tiny_model(tmp_path_factory.mktemp("tiny") / "llama", "llama", tie=False)


# ---------------------------------------------------------------- default model

def test_default_model_path_is_the_embedded_gguf():
    path = default_model_path()
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and path.is_file()


def test_default_model_path_missing_package_says_how_to_install(monkeypatch):
    import engine.model.weights as w

    monkeypatch.setattr(w.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(FileNotFoundError, match="make run"):
        w.default_model_path()


def test_default_gguf_config_matches_known_facts():
    config = ModelConfig.from_gguf(GGUFFile(default_model_path()))
    assert (config.arch, config.num_layers, config.hidden_size, config.intermediate_size) == ("llama", 30, 576, 1536)
    assert (config.num_heads, config.num_kv_heads, config.head_dim, config.vocab_size) == (9, 3, 64, 49152)
    assert config.rope_theta == 100000.0 and config.rope_scaling is None
    assert config.tie_word_embeddings and not config.attention_bias and not config.qk_norm
    assert math.isclose(config.rms_norm_eps, 1e-5, rel_tol=1e-6)
    assert config.max_position_embeddings == 8192 and config.eos_token_ids == [2] and config.bos_token_id == 1


@pytest.mark.slow
def test_default_gguf_config_from_gguf_reader_matches():
    reader = gguf.GGUFReader(default_model_path())  # the gguf package's own (slow) reader works too
    assert ModelConfig.from_gguf(reader) == ModelConfig.from_gguf(GGUFFile(default_model_path()))


@pytest.mark.slow
def test_default_gguf_weights_equal_transformers_gguf_loader():
    config, ours = load_weights(None)
    theirs = hf_default_model().state_dict()
    assert set(ours) == set(theirs) - {"lm_head.weight"}  # tied: transformers shares it with the embedding
    assert set(ours) == set(expected_tensor_names(config))
    for name, t in ours.items():
        assert t.dtype == torch.float32 and t.shape == theirs[name].shape, name
        torch.testing.assert_close(t, theirs[name], rtol=0, atol=1e-6, msg=name)


def test_progress_reaches_one_monotonically(tmp_path, tiny):
    for path in (write_tiny_gguf(tiny, tmp_path / "m.gguf", tokenizer=False),
                 write_tiny_model(tmp_path / "sharded", "llama", sharded=True)):
        seen = []
        load_weights(path, progress=seen.append)
        assert len(seen) >= 3 and seen == sorted(seen) and seen[-1] == pytest.approx(1.0), path


# ---------------------------------------------------------------- dequantization

@pytest.mark.parametrize("qtype", [Q.Q4_0, Q.Q4_1, Q.Q8_0, Q.F16, Q.BF16, Q.F32, Q.Q5_0, Q.Q5_1, Q.Q4_K, Q.Q5_K,
                                   Q.Q6_K])
def test_dequantize_matches_gguf_reference(qtype):
    """Bit-identical to gguf's numpy dequantizer, on random valid blocks (every code, scale and min)."""
    rng = np.random.default_rng(int(qtype))
    x = (rng.standard_normal((24, 512)) * rng.uniform(0.01, 3, (24, 1))).astype(np.float32)
    packed = quantize_ggml(torch.from_numpy(x), qtype)
    expected = gguf.quants.dequantize(packed, qtype)
    raw = torch.from_numpy(np.ascontiguousarray(packed).view(np.uint8))
    ours = dequantize(raw, qtype, (24, 512))
    assert ours.dtype == torch.float32 and ours.shape == (24, 512)
    torch.testing.assert_close(ours, torch.from_numpy(expected).reshape(24, 512), rtol=0, atol=0)
    if qtype not in (Q.F32, Q.F16, Q.BF16):  # and a real quantization of x, not noise
        assert 0 < np.linalg.norm(expected.reshape(24, 512) - x) < 0.15 * np.linalg.norm(x)
    random_bytes = torch.from_numpy(np.random.default_rng(1).integers(0, 256, raw.shape, dtype=np.uint8))
    if qtype in (Q.Q4_K, Q.Q5_K, Q.Q6_K):  # any bytes are valid K-quant blocks: every bit pattern decodes alike
        with np.errstate(all="ignore"):
            want = torch.from_numpy(gguf.quants.dequantize(random_bytes.numpy(), qtype).copy()).reshape(24, 512)
        torch.testing.assert_close(dequantize(random_bytes, qtype, (24, 512)), want, rtol=0, atol=0, equal_nan=True)
    half = dequantize(raw, qtype, (24, 512), torch.float16)
    assert half.dtype == torch.float16
    torch.testing.assert_close(half, ours.half())


def test_dequantize_large_tensor_crosses_chunks():
    x = np.random.default_rng(0).standard_normal((70000 * 32 // 64, 64)).astype(np.float32)  # > one chunk of blocks
    packed = gguf.quants.quantize(x, Q.Q4_1)
    ours = dequantize(torch.from_numpy(packed), Q.Q4_1, x.shape)
    torch.testing.assert_close(ours, torch.from_numpy(gguf.quants.dequantize(packed, Q.Q4_1)), rtol=0, atol=0)


# ---------------------------------------------------------------- tiny safetensors folders

def effective(name: str, t: torch.Tensor, arch: str) -> torch.Tensor:
    """What a stored HF tensor means: Gemma's RMSNorms scale by (1 + w), computed in fp32 as HF does."""
    return t.float() + 1 if arch in GEMMAS and name.endswith("norm.weight") else t


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("tie", [True, False])
def test_tiny_hf_folder_round_trips_exactly(tmp_path, arch, tie):
    folder = write_tiny_model(tmp_path / arch, arch, tie=tie, sharded=arch == "qwen2")
    config, ours = load_weights(folder)
    saved = hf_state(folder)
    assert set(ours) == set(saved) - ({"lm_head.weight"} if tie else set())
    for name, t in ours.items():
        assert torch.equal(t, effective(name, saved[name], arch)), name
    assert config.tie_word_embeddings == tie
    assert config.attention_bias == (arch == "qwen2") and config.qk_norm == (arch in ("qwen3", "gemma3"))
    assert config.sandwich_norm == (arch in ("gemma2", "gemma3")) and config.fused_projections == arch.startswith("phi3")
    assert (config.num_heads, config.num_kv_heads, config.head_dim) == (4, 2, 16)
    assert config.num_layers == (6 if arch == "gemma3" else 2)


def test_sharded_folder_reads_every_shard(tmp_path):
    folder = write_tiny_model(tmp_path / "m", "llama", tie=False, sharded=True)
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) >= 3 and not (folder / "model.safetensors").exists()
    _, ours = load_weights(folder)
    assert set(ours) == set(index["weight_map"])


def test_load_weights_honours_dtype(tiny):
    _, ours = load_weights(tiny, dtype=torch.float16)
    assert {t.dtype for t in ours.values()} == {torch.float16}


def test_qwen3_head_dim_differs_from_hidden_over_heads(tmp_path):
    folder = write_tiny_model(tmp_path / "q3", "qwen3", head_dim=32)
    config, ours = load_weights(folder)
    assert config.head_dim == 32
    assert ours["model.layers.0.self_attn.q_proj.weight"].shape == (4 * 32, 64)


# ---------------------------------------------------------------- tiny GGUF files (llama.cpp layout)

@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3", "gemma", "gemma2", "gemma3", "phi3", "phi3-long"])
def test_tiny_gguf_f32_equals_hf_weights_after_unpermuting(tmp_path, arch):
    tie = arch in ("gemma", "gemma2")  # llama.cpp has no output tensor for these two
    folder = write_tiny_model(tmp_path / arch, arch, tie=tie)
    path = write_tiny_gguf(folder, tmp_path / f"{arch}.gguf", "F32", tokenizer=False)
    config, ours = load_weights(path)
    saved = hf_state(folder)
    assert set(ours) == set(saved) - ({"lm_head.weight"} if tie else set())
    for name, t in ours.items():
        assert torch.equal(t, effective(name, saved[name], arch)), name
    hf_config = ModelConfig.from_hf(json.loads((folder / "config.json").read_text()))
    for field in ("arch", "num_layers", "num_heads", "num_kv_heads", "head_dim", "attention_bias", "qk_norm",
                  "tie_word_embeddings", "rope_theta", "sliding_window", "layer_types", "hidden_act", "sandwich_norm",
                  "embedding_scale", "attn_softcap", "final_softcap", "sliding_rope_theta", "rotary_dims",
                  "fused_projections", "attn_scale", "rope_attention_factor", "long_rope_threshold"):
        assert getattr(config, field) == pytest.approx(getattr(hf_config, field)), field
    assert config.norm_weight_offset == 0 and hf_config.norm_weight_offset == (1.0 if arch in GEMMAS else 0.0)
    for long in (False, True):
        torch.testing.assert_close(config.rope_inv_freq(long), hf_config.rope_inv_freq(long), rtol=1e-6, atol=0)


def test_tiny_gguf_q8_0_weights_are_the_dequantized_file(tmp_path):
    folder = write_tiny_model(tmp_path / "m", "llama")
    path = write_tiny_gguf(folder, tmp_path / "m.gguf", "Q8_0", tokenizer=False)
    _, ours = load_weights(path)
    saved = hf_state(folder)
    for name, t in ours.items():
        tol = 0 if t.dim() == 1 else saved[name].abs().max().item() / 100  # Q8_0: 1/127 of the block max
        torch.testing.assert_close(t, saved[name], rtol=0, atol=tol, msg=name)


def test_tiny_gguf_llama3_rope_freqs_tensor_gives_llama3_frequencies(tmp_path):
    folder = write_tiny_model(tmp_path / "m", "llama3")
    path = write_tiny_gguf(folder, tmp_path / "m.gguf", tokenizer=False)
    config, ours = load_weights(path)
    assert config.rope_scaling["rope_type"] == "freq_factors" and "rope_freqs.weight" not in ours
    hf_inv = ModelConfig.from_hf(json.loads((folder / "config.json").read_text())).rope_inv_freq()
    torch.testing.assert_close(config.rope_inv_freq(), hf_inv, rtol=1e-6, atol=0)
    assert not torch.allclose(hf_inv, ModelConfig.from_hf(tiny_config("llama").to_dict()).rope_inv_freq())


# ---------------------------------------------------------------- config

def test_rope_inv_freq_matches_transformers_for_each_rope_type():
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    for scaling in (None, LLAMA3_ROPE, {**LLAMA3_ROPE, "factor": 32.0, "original_max_position_embeddings": 8192},
                    {"rope_type": "linear", "factor": 4.0}):
        hf = tiny_config("llama", rope_scaling=scaling, head_dim=64, rope_theta=500000.0)
        ours = ModelConfig.from_hf(hf.to_dict()).rope_inv_freq()
        kind = (scaling or {}).get("rope_type", "default")
        if kind == "default":
            expected = 1.0 / (500000.0 ** (torch.arange(0, 64, 2, dtype=torch.float) / 64))
        else:
            expected, _ = ROPE_INIT_FUNCTIONS[kind](hf, "cpu")
        assert ours.dtype == torch.float32 and ours.shape == (32,)
        torch.testing.assert_close(ours, expected, rtol=0, atol=0, msg=kind)


def test_from_hf_reads_transformers_v4_rope_layout():
    v4 = {**tiny_config("llama").to_dict(), "rope_theta": 500000.0,
          "rope_scaling": {"type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                           "original_max_position_embeddings": 8192}}
    v4.pop("rope_parameters", None)
    config = ModelConfig.from_hf(v4)
    assert config.rope_theta == 500000.0 and config.rope_scaling["rope_type"] == "llama3"


def test_rope_inv_freq_matches_transformers_for_longrope_and_gemma3_layers():
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    hf = tiny_config("phi3-long")
    ours = ModelConfig.from_hf(hf.to_dict())
    short, factor = ROPE_INIT_FUNCTIONS["longrope"](hf, "cpu")
    long, _ = ROPE_INIT_FUNCTIONS["longrope"](hf, "cpu", seq_len=65)
    torch.testing.assert_close(ours.rope_inv_freq(), short, rtol=0, atol=0)
    torch.testing.assert_close(ours.rope_inv_freq(long=True), long, rtol=0, atol=0)
    assert ours.rope_attention_factor == pytest.approx(factor) and factor > 1.1 and ours.rotary_dims == 8
    g3 = tiny_config("gemma3")
    ours = ModelConfig.from_hf(g3.to_dict())
    for kind, inv in (("full_attention", ours.rope_inv_freq()), ("sliding_attention", ours.sliding_rope_inv_freq())):
        p = g3.rope_parameters[kind]
        fn = ROPE_INIT_FUNCTIONS[p["rope_type"]] if p["rope_type"] != "default" else None
        expected = fn(g3, "cpu", layer_type=kind)[0] if fn else 1.0 / (p["rope_theta"] ** (torch.arange(0, 16, 2).float() / 16))
        torch.testing.assert_close(inv, expected, rtol=0, atol=0, msg=kind)
    assert [ours.layer_window(i) for i in range(6)] == [16] * 5 + [None]
    assert [ours.layer_uses_sliding_rope(i) for i in range(6)] == [True] * 5 + [False]


def test_from_hf_reads_v4_layouts_of_gemma3_and_phi3():
    """Hub configs written by transformers 4: rope_local_base_freq / sliding_window_pattern (Gemma 3),
    rope_scaling type "su" with top-level original_max_position_embeddings (Phi-3.5)."""
    g3 = {"model_type": "gemma3_text", "vocab_size": 100, "hidden_size": 64, "intermediate_size": 128,
          "num_hidden_layers": 12, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
          "rope_theta": 1e6, "rope_local_base_freq": 1e4, "rope_scaling": {"rope_type": "linear", "factor": 8.0},
          "sliding_window": 512, "sliding_window_pattern": 6, "query_pre_attn_scalar": 256,
          "hidden_activation": "gelu_pytorch_tanh"}
    c = ModelConfig.from_hf(g3)
    assert c.rope_scaling == {"rope_type": "linear", "factor": 8.0} and c.sliding_rope_theta == 1e4
    assert [c.layer_window(i) for i in range(12)] == ([512] * 5 + [None]) * 2
    assert c.attn_scale == 256 ** -0.5 and c.hidden_act == "gelu_tanh" and c.tie_word_embeddings
    phi = {"model_type": "phi3", "vocab_size": 100, "hidden_size": 64, "intermediate_size": 128,
           "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4, "max_position_embeddings": 131072,
           "original_max_position_embeddings": 4096, "sliding_window": 262144,
           "rope_scaling": {"type": "su", "short_factor": [1.0] * 8, "long_factor": [2.0] * 8}}
    c = ModelConfig.from_hf(phi)
    assert c.rope_scaling["rope_type"] == "longrope" and c.long_rope_threshold == 4096
    assert c.rope_attention_factor == pytest.approx(math.sqrt(1 + math.log(32) / math.log(4096)))
    assert c.fused_projections and c.layer_window(1) == 262144


def test_from_hf_refuses_mixture_of_experts_clearly():
    """MoE families other than Qwen3-MoE, Mixtral and gpt-oss (engine.model.moe) are refused by name."""
    import transformers

    for cfg in (transformers.Qwen2MoeConfig(),):
        with pytest.raises(NotImplementedError, match="mixture-of-experts.*not supported yet"):
            ModelConfig.from_hf(cfg.to_dict())
    for cfg in (transformers.Qwen3MoeConfig(), transformers.MixtralConfig(), transformers.GptOssConfig()):
        assert ModelConfig.from_hf(cfg.to_dict()).num_experts > 1


def test_from_gguf_refuses_mixture_of_experts_clearly(tmp_path):
    """MoE GGUF files other than qwen3moe (Mixtral's, written as llama; DeepSeek's) are refused by name."""
    for arch, extra in (("deepseek2", {"deepseek2.expert_count": 64}), ("llama", {"llama.expert_count": 8})):
        w = gguf.GGUFWriter(tmp_path / f"{arch}.gguf", arch)
        w.add_block_count(1)
        for key, value in extra.items():
            w.add_uint32(key, value)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        with pytest.raises(NotImplementedError, match="mixture-of-experts"):
            load_weights(tmp_path / f"{arch}.gguf")


def test_from_hf_rejects_unsupported_arch_and_rope():
    with pytest.raises(ValueError, match=r"'falcon'.*llama, mistral, qwen2, qwen3, gemma"):
        ModelConfig.from_hf({**tiny_config("llama").to_dict(), "model_type": "falcon", "architectures": ["Falcon"]})
    with pytest.raises(NotImplementedError, match="dynamic"):
        ModelConfig.from_hf({**tiny_config("llama").to_dict(), "rope_parameters": {"rope_type": "dynamic", "factor": 2}})
    with pytest.raises(ValueError, match="hidden_size"):
        ModelConfig.from_hf({k: v for k, v in tiny_config("llama").to_dict().items() if k != "hidden_size"})


# ---------------------------------------------------------------- bad inputs

def test_missing_path(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope"):
        load_weights(tmp_path / "nope")


def test_folder_without_config_or_weights(tmp_path, tiny):
    with pytest.raises(FileNotFoundError, match="config.json"):
        load_weights(tmp_path)
    (tmp_path / "config.json").write_text((tiny / "config.json").read_text())
    with pytest.raises(FileNotFoundError, match="model.safetensors"):
        load_weights(tmp_path)


def test_not_a_model_file(tmp_path):
    f = tmp_path / "weights.bin"
    f.write_bytes(b"x")
    with pytest.raises(ValueError, match="neither"):
        load_weights(f)


def test_truncated_safetensors_names_the_file(tmp_path, tiny):
    data = (tiny / "model.safetensors").read_bytes()
    (tmp_path / "config.json").write_text((tiny / "config.json").read_text())
    (tmp_path / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match="model.safetensors"):
        load_weights(tmp_path)


def test_missing_and_unexpected_tensors(tmp_path, tiny):
    state = load_file(tiny / "model.safetensors")
    (tmp_path / "config.json").write_text((tiny / "config.json").read_text())
    save_file({k: v for k, v in state.items() if "layers.1.mlp.up_proj" not in k}, tmp_path / "model.safetensors")
    with pytest.raises(ValueError, match=r"missing tensors: model\.layers\.1\.mlp\.up_proj\.weight"):
        load_weights(tmp_path)
    save_file({**state, "model.layers.0.mlp.up_proj.bias": torch.zeros(128)}, tmp_path / "model.safetensors")
    with pytest.raises(ValueError, match="up_proj.bias"):
        load_weights(tmp_path)


def test_wrong_shape_is_reported(tmp_path, tiny):
    state = load_file(tiny / "model.safetensors")
    state["model.norm.weight"] = torch.ones(65)
    (tmp_path / "config.json").write_text((tiny / "config.json").read_text())
    save_file(state, tmp_path / "model.safetensors")
    with pytest.raises(ValueError, match=r"model\.norm\.weight has shape \(65,\)"):
        load_weights(tmp_path)


def test_missing_shard(tmp_path):
    folder = write_tiny_model(tmp_path / "m", "llama", sharded=True)
    next(folder.glob("model-0000*.safetensors")).unlink()
    with pytest.raises(FileNotFoundError, match="shard"):
        load_weights(folder)


def test_corrupt_and_truncated_gguf(tmp_path, tiny):
    path = write_tiny_gguf(tiny, tmp_path / "m.gguf", tokenizer=False)
    data = path.read_bytes()
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"NOPE" + data[4:])
    with pytest.raises(ValueError, match="not a GGUF file"):
        load_weights(bad)
    bad.write_bytes(data[: len(data) - 1000])
    with pytest.raises(ValueError, match="bad.gguf is truncated"):
        load_weights(bad)
    bad.write_bytes(data[:100])
    with pytest.raises(ValueError, match="bad.gguf"):
        load_weights(bad)
    bad.write_bytes(b"")
    with pytest.raises(ValueError, match="bad.gguf"):
        load_weights(bad)


def test_gguf_with_unsupported_architecture(tmp_path):
    w = gguf.GGUFWriter(tmp_path / "x.gguf", "falcon")
    w.add_block_count(1)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ValueError, match=r"'falcon'.*llama, mistral, qwen2, qwen3, gemma"):
        load_weights(tmp_path / "x.gguf")
