"""Weight loading: safetensors folders and GGUF files against transformers and the gguf package."""

import json
import math

import gguf
import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from engine.model.config import ModelConfig
from engine.model.weights import GGUFFile, default_model_path, dequantize, expected_tensor_names, load_weights
from tests.tiny_models import ARCHS, LLAMA3_ROPE, hf_default_model, tiny_config, write_tiny_gguf, write_tiny_model

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

@pytest.mark.parametrize("qtype", [Q.Q4_0, Q.Q4_1, Q.Q8_0, Q.F16, Q.BF16, Q.F32, Q.Q5_0, Q.Q5_1])
def test_dequantize_matches_gguf_reference(qtype):
    rng = np.random.default_rng(int(qtype))
    x = (rng.standard_normal((24, 96)) * rng.uniform(0.01, 3, (24, 1))).astype(np.float32)
    packed = gguf.quants.quantize(x, qtype)
    expected = gguf.quants.dequantize(packed, qtype)
    raw = torch.from_numpy(np.ascontiguousarray(packed).view(np.uint8))
    ours = dequantize(raw, qtype, (24, 96))
    assert ours.dtype == torch.float32 and ours.shape == (24, 96)
    torch.testing.assert_close(ours, torch.from_numpy(expected), rtol=0, atol=0)
    half = dequantize(raw, qtype, (24, 96), torch.float16)
    assert half.dtype == torch.float16
    torch.testing.assert_close(half, ours.half())


def test_dequantize_large_tensor_crosses_chunks():
    x = np.random.default_rng(0).standard_normal((70000 * 32 // 64, 64)).astype(np.float32)  # > one chunk of blocks
    packed = gguf.quants.quantize(x, Q.Q4_1)
    ours = dequantize(torch.from_numpy(packed), Q.Q4_1, x.shape)
    torch.testing.assert_close(ours, torch.from_numpy(gguf.quants.dequantize(packed, Q.Q4_1)), rtol=0, atol=0)


# ---------------------------------------------------------------- tiny safetensors folders

@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("tie", [True, False])
def test_tiny_hf_folder_round_trips_exactly(tmp_path, arch, tie):
    folder = write_tiny_model(tmp_path / arch, arch, tie=tie, sharded=arch == "qwen2")
    config, ours = load_weights(folder)
    saved = hf_state(folder)
    assert set(ours) == set(saved) - ({"lm_head.weight"} if tie else set())
    for name, t in ours.items():
        assert torch.equal(t, saved[name]), name
    assert config.tie_word_embeddings == tie
    assert config.attention_bias == (arch == "qwen2") and config.qk_norm == (arch == "qwen3")
    assert (config.num_layers, config.num_heads, config.num_kv_heads, config.head_dim) == (2, 4, 2, 16)


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

@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_tiny_gguf_f32_equals_hf_weights_after_unpermuting(tmp_path, arch):
    folder = write_tiny_model(tmp_path / arch, arch, tie=False)
    path = write_tiny_gguf(folder, tmp_path / f"{arch}.gguf", "F32", tokenizer=False)
    config, ours = load_weights(path)
    saved = hf_state(folder)
    assert set(ours) == set(saved)
    for name, t in ours.items():
        assert torch.equal(t, saved[name]), name
    hf_config = ModelConfig.from_hf(json.loads((folder / "config.json").read_text()))
    for field in ("arch", "num_layers", "num_heads", "num_kv_heads", "head_dim", "attention_bias", "qk_norm",
                  "tie_word_embeddings", "rope_theta"):
        assert getattr(config, field) == getattr(hf_config, field), field


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


def test_from_hf_rejects_unsupported_arch_and_rope():
    with pytest.raises(ValueError, match=r"'gemma'.*llama, mistral, qwen2, qwen3"):
        ModelConfig.from_hf({**tiny_config("llama").to_dict(), "model_type": "gemma", "architectures": ["Gemma"]})
    with pytest.raises(NotImplementedError, match="yarn"):
        ModelConfig.from_hf({**tiny_config("llama").to_dict(), "rope_parameters": {"rope_type": "yarn", "factor": 2}})
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
    w = gguf.GGUFWriter(tmp_path / "x.gguf", "gemma2")
    w.add_block_count(1)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ValueError, match=r"'gemma2'.*llama, mistral, qwen2, qwen3"):
        load_weights(tmp_path / "x.gguf")
