"""Which models on disk see images: a vision projector beside a GGUF (LM Studio's layout), of several the
one named like the model, an Ollama projector layer; the projector never listed as a model; the Model
tab's Input column (real scan of a fake home, real Qt widgets)."""
from __future__ import annotations

import json
import shutil


from app.panels.model_browser import COLUMNS
from engine.model.catalog import discovery
from tests.app.test_model_browser import panel, rows  # noqa: F401  (the Model tab over the fake home)
from tests.engine.test_discovery import _write_arch_only_gguf, home  # noqa: F401
from tests.tiny_models import write_tiny_gguf


def test_discovery_pairs_models_with_their_projector(home):  # noqa: F811
    found = {m.name: m for m in discovery.find_models(env={}, home=home)}
    assert not any("mmproj" in name for name in found)
    lm = found["lmstudio-community/tiny-GGUF/tiny-Q8_0.gguf"]
    assert lm.mmproj is not None and lm.mmproj.name == "mmproj-tiny-f16.gguf" and lm.sees_images
    gpt4all = found["tiny-gpt4all.gguf"]
    assert gpt4all.mmproj is None and not gpt4all.sees_images
    assert not found["tinyorg/tiny-llama"].sees_images  # an HF text model: no vision tower in its config


def test_of_several_projectors_the_one_named_like_the_model(tmp_path, tiny_llama_folder):
    folder = tmp_path / "models" / "pub" / "vl-GGUF"
    folder.mkdir(parents=True)
    gguf_file = write_tiny_gguf(tiny_llama_folder, folder / "Qwen2-VL-7B-Q4_K_M.gguf", "Q8_0")
    shutil.copy(gguf_file, folder / "Gemma3-4B-Q8_0.gguf")
    for name in ("mmproj-Gemma3-4B-f16.gguf", "mmproj-Qwen2-VL-7B-f16.gguf"):
        _write_arch_only_gguf(folder / name, "clip")
    assert discovery.find_mmproj(folder / "Qwen2-VL-7B-Q4_K_M.gguf").name == "mmproj-Qwen2-VL-7B-f16.gguf"
    assert discovery.find_mmproj(folder / "Gemma3-4B-Q8_0.gguf").name == "mmproj-Gemma3-4B-f16.gguf"
    found = discovery.find_models([tmp_path / "models"], env={}, home=tmp_path / "nohome")
    assert sorted(m.path.name for m in found) == ["Gemma3-4B-Q8_0.gguf", "Qwen2-VL-7B-Q4_K_M.gguf"]


def test_ollama_projector_layer_and_hf_vision_config(tmp_path, tiny_llama_folder):
    home = tmp_path / "home"
    ollama = home / ".ollama" / "models"
    (ollama / "blobs").mkdir(parents=True)
    write_tiny_gguf(tiny_llama_folder, ollama / "blobs" / ("sha256-" + "a" * 64), "Q8_0")
    _write_arch_only_gguf(ollama / "blobs" / ("sha256-" + "d" * 64), "clip")
    m = ollama / "manifests" / "registry.ollama.ai" / "library" / "llava" / "latest"
    m.parent.mkdir(parents=True)
    m.write_text(json.dumps({"layers": [
        {"mediaType": "application/vnd.ollama.image.model", "digest": "sha256:" + "a" * 64},
        {"mediaType": "application/vnd.ollama.image.projector", "digest": "sha256:" + "d" * 64}]}))
    vl = tmp_path / "added" / "vl"
    shutil.copytree(tiny_llama_folder, vl)
    cfg = json.loads((vl / "config.json").read_text())
    (vl / "config.json").write_text(json.dumps({**cfg, "vision_config": {"hidden_size": 8}}))
    found = {m.name: m for m in discovery.find_models([tmp_path / "added"], env={}, home=home)}
    assert found["llava:latest"].mmproj.name == "sha256-" + "d" * 64 and found["llava:latest"].sees_images
    assert found["vl"].sees_images and found["vl"].mmproj is None


def test_model_tab_says_sees_images_or_text_only(panel):  # noqa: F811
    browser = panel.browser
    found = rows(browser)
    col = COLUMNS.index("Architecture")
    lm = found["lmstudio-community/tiny-GGUF/tiny-Q8_0.gguf"]
    assert lm.text(col) == "llama · images" and lm.toolTip(col).startswith("Sees images: vision projector")
    assert "mmproj-tiny-f16.gguf" in lm.toolTip(col)
    text_only = found["tiny-gpt4all.gguf"]
    assert text_only.text(col) == "llama"
    assert text_only.toolTip(col).startswith("Text only: no vision projector (mmproj")
    assert not any("mmproj" in name for name in found)
    browser.tree.setCurrentItem(lm)
    assert browser.estimate_label.text().endswith("Sees images.")
    browser.tree.setCurrentItem(text_only)
    assert browser.estimate_label.text().endswith("Text only.")
