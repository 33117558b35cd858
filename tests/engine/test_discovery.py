"""Finding models on disk (engine.discovery): each tool's real folder layout built in a fake home with tiny
real model files; headers only; unsupported ones listed with their reason; the estimate says fits or not."""

import json
import shutil

import gguf
import pytest

from engine import Model
from engine.model.catalog import discovery
from engine.model.catalog import memory
from tests.tiny_models import write_tiny_gguf, write_tiny_model


def _write_arch_only_gguf(path, arch):
    w = gguf.GGUFWriter(path, arch)
    w.add_block_count(1)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.fixture(scope="module")
def home(tmp_path_factory, tiny_llama_folder):
    """A home folder holding models the way HF, LM Studio, GPT4All and Ollama store them."""
    home = tmp_path_factory.mktemp("home")
    gguf_file = write_tiny_gguf(tiny_llama_folder, tmp_path_factory.mktemp("src") / "tiny-Q8_0.gguf", "Q8_0")
    # Hugging Face hub cache: models--org--name/{refs/main, snapshots/<rev>/...}, an older revision beside it
    repo = home / ".cache" / "huggingface" / "hub" / "models--tinyorg--tiny-llama"
    for rev in ("old", "abc123"):
        shutil.copytree(tiny_llama_folder, repo / "snapshots" / rev)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("abc123")
    gguf_repo = home / ".cache" / "huggingface" / "hub" / "models--tinyorg--tiny-GGUF" / "snapshots" / "r1"
    gguf_repo.mkdir(parents=True)
    shutil.copy(gguf_file, gguf_repo / "tiny-Q8_0.gguf")
    moe = write_tiny_model(home / "tmpmoe", "llama")
    cfg = json.loads((moe / "config.json").read_text())
    (moe / "config.json").write_text(json.dumps({**cfg, "model_type": "qwen2_moe", "num_experts": 8}))
    shutil.move(moe, home / ".cache" / "huggingface" / "hub" / "models--acme--moe" / "snapshots" / "r")
    # LM Studio: publisher/repo/file.gguf, with a vision projector and a second split part beside it
    lm = home / ".lmstudio" / "models" / "lmstudio-community" / "tiny-GGUF"
    lm.mkdir(parents=True)
    shutil.copy(gguf_file, lm / "tiny-Q8_0.gguf")
    _write_arch_only_gguf(lm / "mmproj-tiny-f16.gguf", "clip")
    _write_arch_only_gguf(lm / "big-00002-of-00002.gguf", "llama")
    _write_arch_only_gguf(lm / "falcon-7b.Q4_0.gguf", "falcon")
    # GPT4All: files straight in its data folder
    g4 = discovery._gpt4all_dir(home)
    g4.mkdir(parents=True)
    shutil.copy(gguf_file, g4 / "tiny-gpt4all.gguf")
    # Ollama: manifests name the model layer's digest; the blob has no suffix; one blob is missing
    ollama = home / ".ollama" / "models"
    (ollama / "blobs").mkdir(parents=True)
    shutil.copy(gguf_file, ollama / "blobs" / ("sha256-" + "a" * 64))
    for model, digest in (("tinyllama", "a" * 64), ("gone", "b" * 64)):
        m = ollama / "manifests" / "registry.ollama.ai" / "library" / model / "latest"
        m.parent.mkdir(parents=True)
        m.write_text(json.dumps({"layers": [
            {"mediaType": "application/vnd.ollama.image.template", "digest": "sha256:" + "c" * 64},
            {"mediaType": "application/vnd.ollama.image.model", "digest": "sha256:" + digest}]}))
    return home


def test_finds_every_tool_layout(home, tmp_path):
    added = tmp_path / "mine"
    added.mkdir()
    _write_arch_only_gguf(added / "notes-not-a-model.gguf", "whisper")
    found = discovery.find_models([added], env={}, home=home, cache_tokens=2048)
    by = {(m.source, m.name): m for m in found}
    hf = by[(discovery.HF, "tinyorg/tiny-llama")]
    assert hf.path.name == "abc123" and hf.supported and hf.info.kind == "hf"  # refs/main, not the older one
    assert by[(discovery.HF, "tinyorg/tiny-GGUF/tiny-Q8_0.gguf")].supported
    lm = by[(discovery.LMSTUDIO, "lmstudio-community/tiny-GGUF/tiny-Q8_0.gguf")]
    assert lm.supported and lm.info.quant == "Q8_0" and lm.info.arch == "llama"
    assert lm.info.params > 3_000_000 and lm.info.file_bytes == lm.path.stat().st_size
    assert by[(discovery.GPT4ALL, "tiny-gpt4all.gguf")].supported
    ollama = by[(discovery.OLLAMA, "tinyllama:latest")]
    assert ollama.supported and ollama.path.name.startswith("sha256-")
    assert not by[(discovery.OLLAMA, "gone:latest")].supported
    assert "missing" in by[(discovery.OLLAMA, "gone:latest")].reason
    # unsupported ones stay listed, with why
    assert "mixture-of-experts" in by[(discovery.HF, "acme/moe")].reason
    assert "'falcon'" in by[(discovery.LMSTUDIO, "lmstudio-community/tiny-GGUF/falcon-7b.Q4_0.gguf")].reason
    assert "'whisper'" in by[(discovery.ADDED, "notes-not-a-model.gguf")].reason
    names = {m.name for m in found}
    assert not any("mmproj" in n or "00002-of" in n for n in names)
    assert all(m.estimate is not None for m in found if m.supported)


def test_found_models_load(home):
    """What discovery lists is what Model.load takes, Ollama's suffix-less blobs included."""
    found = {m.name: m for m in discovery.find_models(env={}, home=home)}
    for name in ("tinyllama:latest", "tinyorg/tiny-llama"):
        model = Model.load(found[name].path)
        assert model.config.num_layers == 2 and model.num_parameters() > 3_000_000


def test_fits_follows_the_estimate(home, monkeypatch):
    monkeypatch.setattr(memory, "available_bytes", lambda device="cpu": 64 << 30)
    assert all(m.fits for m in discovery.find_models(env={}, home=home) if m.supported)
    monkeypatch.setattr(memory, "available_bytes", lambda device="cpu": 200 << 20)
    assert all(m.fits is False for m in discovery.find_models(env={}, home=home) if m.supported)


def test_locations_follow_the_tools_environment_variables(tmp_path):
    env = {"HF_HUB_CACHE": str(tmp_path / "hub"), "OLLAMA_MODELS": str(tmp_path / "ollama")}
    locations = dict((p, s) for s, p in discovery.model_locations(env, tmp_path))
    assert locations[tmp_path / "hub"] == discovery.HF and locations[tmp_path / "ollama"] == discovery.OLLAMA
    env = {"HF_HOME": str(tmp_path / "hf")}
    assert (discovery.HF, tmp_path / "hf" / "hub") in discovery.model_locations(env, tmp_path)
    assert any("nomic.ai" in str(p) and "GPT4All" in str(p) for _, p in discovery.model_locations({}, tmp_path))
    assert discovery.find_models(env={}, home=tmp_path / "empty") == []

