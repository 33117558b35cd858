"""LoRA panel and model panel: real widgets offscreen, real adapter folders and JSON files on disk."""
import json

import numpy as np
import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QFileDialog
from safetensors.numpy import save_file

from app.panels.lora_panel import LoraPanel, inspect_adapter
from app.panels.model_panel import ModelPanel

# ------------------------------------------------------------------------------------------- LoRA


def write_adapter(folder, rank=4, alpha=8, targets=("q_proj", "v_proj"), weights="safetensors"):
    folder.mkdir(parents=True)
    (folder / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA", "r": rank, "lora_alpha": alpha, "target_modules": list(targets),
        "base_model_name_or_path": "HuggingFaceTB/SmolLM2-135M-Instruct", "bias": "none"}))
    if weights == "safetensors":
        tensors = {}
        for t in targets:
            prefix = f"base_model.model.model.layers.0.self_attn.{t}"
            tensors[f"{prefix}.lora_A.weight"] = np.random.default_rng(0).standard_normal((rank, 64), np.float32)
            tensors[f"{prefix}.lora_B.weight"] = np.zeros((64, rank), np.float32)
        save_file(tensors, str(folder / "adapter_model.safetensors"))
    else:
        (folder / "adapter_model.bin").write_bytes(b"torch pickle stand-in: the panel never opens .bin files")
    return folder


@pytest.fixture
def lora_dir(tmp_path):
    root = tmp_path / "loras"
    write_adapter(root / "pirate", rank=8, alpha=16)
    write_adapter(root / "terse", rank=4, alpha=4, targets=("q_proj", "k_proj", "o_proj"), weights="bin")
    broken = write_adapter(root / "broken-weights")
    (broken / "adapter_model.safetensors").write_bytes(b"\x00\x01 not a safetensors file")
    bad_cfg = write_adapter(root / "bad-config")
    (bad_cfg / "adapter_config.json").write_text("{ not json")
    (root / "not-an-adapter").mkdir()
    (root / "not-an-adapter" / "notes.txt").write_text("hello")
    (write_adapter(root / "no-weights") / "adapter_model.safetensors").unlink()
    return root


@pytest.fixture
def lora_panel(qtbot, lora_dir):
    panel = LoraPanel(lora_dir=lora_dir)
    qtbot.addWidget(panel)
    panel.show()
    return panel


def row_of(panel, name):
    return [a.name for a in panel.adapters()].index(name)


def test_lora_scan_lists_adapters_and_flags_broken_ones(lora_panel):
    names = sorted(a.name for a in lora_panel.adapters())
    assert names == ["bad-config", "broken-weights", "no-weights", "pirate", "terse"]  # the engine's rule
    info = {a.name: a for a in lora_panel.adapters()}
    assert info["pirate"].problem is None and info["pirate"].rank == 8 and info["pirate"].alpha == 16
    assert info["terse"].problem is None and info["terse"].targets == ("q_proj", "k_proj", "o_proj")
    assert "adapter_model.safetensors" in info["broken-weights"].problem
    assert "adapter_config.json" in info["bad-config"].problem
    assert "no adapter weights" in info["no-weights"].problem  # listed, flagged, not silently hidden
    table = lora_panel.table
    assert "r=8" in table.item(row_of(lora_panel, "pirate"), lora_panel.COL_INFO).text()
    broken = table.item(row_of(lora_panel, "broken-weights"), 0)
    assert not broken.flags() & Qt.ItemIsUserCheckable  # can't be chosen
    assert lora_panel.empty_label.isHidden()


def test_lora_apply_emits_paths_and_scales(lora_panel, lora_dir, qtbot):
    table = lora_panel.table
    table.item(row_of(lora_panel, "pirate"), 0).setCheckState(Qt.Checked)
    table.cellWidget(row_of(lora_panel, "pirate"), 1).setValue(0.5)
    table.item(row_of(lora_panel, "terse"), 0).setCheckState(Qt.Checked)
    with qtbot.waitSignal(lora_panel.apply_requested) as sig:
        qtbot.mouseClick(lora_panel.apply_button, Qt.LeftButton)
    chosen = dict(sig.args[0])
    assert chosen == {str((lora_dir / "pirate").resolve()): 0.5, str((lora_dir / "terse").resolve()): 1.0}
    # "None" then Apply: the empty list means no LoRA
    qtbot.mouseClick(lora_panel.clear_button, Qt.LeftButton)
    with qtbot.waitSignal(lora_panel.apply_requested) as sig:
        qtbot.mouseClick(lora_panel.apply_button, Qt.LeftButton)
    assert sig.args[0] == []


def test_lora_set_selection_by_name(lora_panel, lora_dir):
    lora_panel.set_selection({"terse": -0.25, "broken-weights": 1.0})
    assert lora_panel.selection() == [(str((lora_dir / "terse").resolve()), -0.25)]  # broken one refused


def test_lora_active_pending_and_errors_are_shown(lora_panel):
    lora_panel.set_active(["pirate", "terse"])
    assert lora_panel.active_label.text() == "Default LoRA: pirate, terse"
    lora_panel.set_active([])
    assert lora_panel.active_label.text() == "Default LoRA: none"
    assert lora_panel.pending_label.isHidden()
    lora_panel.set_pending(True)
    assert lora_panel.pending_label.isVisible()
    assert "waiting for running jobs" in lora_panel.pending_label.text()
    lora_panel.set_pending(False)
    assert lora_panel.pending_label.isHidden()
    lora_panel.show_error("pirate: lora_A shape (8, 64) does not match q_proj (576, 576)")
    assert lora_panel.error_label.isVisible() and "does not match" in lora_panel.error_label.text()

    class Unprintable:
        def __str__(self):
            raise RuntimeError("boom")

    lora_panel.show_error(Unprintable())  # never raises into the event loop
    assert "Unprintable" in lora_panel.error_label.text()


def test_lora_loaded_column_asks_to_load_and_unload_and_follows_the_engine(lora_panel, lora_dir, qtbot):
    table, row = lora_panel.table, row_of(lora_panel, "pirate")
    loaded = table.item(row, lora_panel.COL_LOADED)
    with qtbot.waitSignal(lora_panel.load_requested) as sig:
        loaded.setCheckState(Qt.Checked)
    assert sig.args == [str((lora_dir / "pirate").resolve())]
    with qtbot.assertNotEmitted(lora_panel.load_requested), qtbot.assertNotEmitted(lora_panel.unload_requested):
        lora_panel.set_loaded(["pirate", "from-the-api"])  # the engine's list: shown, no requests echoed
    assert lora_panel.loaded_label.text() == "Loaded: pirate, from-the-api"
    with qtbot.waitSignal(lora_panel.unload_requested) as sig:
        loaded.setCheckState(Qt.Unchecked)
    assert sig.args == ["pirate"]
    lora_panel.set_loaded([])
    assert loaded.checkState() == Qt.Unchecked and lora_panel.loaded_label.text() == "Loaded: none"
    broken = table.item(row_of(lora_panel, "broken-weights"), lora_panel.COL_LOADED)
    assert not broken.flags() & Qt.ItemIsUserCheckable


def test_lora_add_folder_button_and_adding_a_known_folder_again(qtbot, tmp_path, monkeypatch):
    panel = LoraPanel(lora_dir=None)
    qtbot.addWidget(panel)
    assert panel.adapters() == [] and not panel.empty_label.isHidden()
    user = tmp_path / "mine"
    write_adapter(user / "a")
    monkeypatch.setattr(QFileDialog, "getExistingDirectory", lambda *a, **k: str(user))
    qtbot.mouseClick(panel.add_button, Qt.LeftButton)
    assert [a.name for a in panel.adapters()] == ["a"]
    assert panel.folders() == [str(user.resolve())]
    assert panel.add_folder(user) == 0  # nothing twice
    write_adapter(user / "b")
    assert panel.add_folder(user) == 1  # a known folder again: what was added on disk since
    assert [a.name for a in panel.adapters()] == ["a", "b"]
    assert panel.add_folder(write_adapter(tmp_path / "single")) == 1  # an adapter folder itself
    with pytest.raises(FileNotFoundError, match="missing"):
        panel.add_folder(tmp_path / "missing")
    monkeypatch.setattr(QFileDialog, "getExistingDirectory", lambda *a, **k: str(tmp_path / "gone"))
    qtbot.mouseClick(panel.add_button, Qt.LeftButton)  # the button shows the error instead of raising
    assert "gone" in panel.error_label.text()


def test_inspect_adapter_never_raises(tmp_path):
    folder = tmp_path / "x"
    folder.mkdir()
    (folder / "adapter_config.json").write_text("[1, 2]")
    assert "JSON object" in inspect_adapter(folder).problem

# ------------------------------------------------------------------------------------------ model


@pytest.fixture
def models(tmp_path):
    gguf = tmp_path / "tiny.gguf"
    gguf.write_bytes(b"GGUF")
    hf = tmp_path / "hf-model"
    hf.mkdir()
    (hf / "config.json").write_text("{}")
    return gguf, hf


@pytest.fixture
def model_panel(qtbot, tmp_path):
    panel = ModelPanel(tmp_path / "state" / "recent.json")
    qtbot.addWidget(panel)
    panel.show()
    return panel


def loaded_info(path, name="tiny"):
    return {"name": name, "path": str(path), "params": 134_515_008, "memory_bytes": 540 * 2**20,
            "device": "cpu", "dtype": "float32", "cache_tokens": 4096, "pages": 16}


def test_model_load_payload(model_panel, models, qtbot):
    gguf, hf = models
    model_panel.path_edit.setText(str(gguf))
    model_panel.cache_spin.setValue(4096)
    assert "16 pages of 256" in model_panel.pages_label.text()
    model_panel.kv_combo.setCurrentIndex(model_panel.kv_combo.findData("q6"))
    model_panel.weights_combo.setCurrentIndex(model_panel.weights_combo.findData("dense"))
    model_panel.draft_edit.setText(str(hf))
    model_panel.ngram_check.setChecked(True)
    with qtbot.waitSignal(model_panel.load_requested) as sig:
        qtbot.mouseClick(model_panel.load_button, Qt.LeftButton)
    assert sig.args[0] == {"path": str(gguf), "cache_tokens": 4096, "kv_quant": "q6", "weights": "dense",
                           "draft_model": str(hf), "use_ngram": True}
    assert not model_panel.load_button.isEnabled() and model_panel.progress.isVisible()


def test_model_default_path_is_none(model_panel, qtbot):
    model_panel.kv_combo.setCurrentIndex(0)
    with qtbot.waitSignal(model_panel.load_requested) as sig:
        model_panel.request_load()
    assert sig.args[0]["path"] is None and sig.args[0]["kv_quant"] is None and sig.args[0]["draft_model"] is None
    assert sig.args[0]["weights"] == "auto"  # 4-bit matmuls for the default GGUF on a CPU


def test_model_progress_loaded_and_recent_persist(model_panel, models, qtbot, tmp_path):
    gguf, hf = models
    model_panel.path_edit.setText(str(hf))
    model_panel.request_load()
    model_panel.set_progress(0.5)
    assert model_panel.progress.value() == 500
    for bad in (1.5, -0.1, float("nan")):
        with pytest.raises(ValueError, match="fraction"):
            model_panel.set_progress(bad)
    model_panel.set_loaded(loaded_info(hf, "hf-model"))
    text = model_panel.loaded_label.text()
    assert "hf-model" in text and "134.5 M" in text and "540.0 MiB" in text and "cpu" in text and "16 pages" in text
    assert model_panel.load_button.isEnabled() and model_panel.progress.isHidden()
    model_panel.set_loaded(loaded_info(gguf))
    model_panel.set_loaded(loaded_info(hf, "hf-model"))
    assert [model_panel.recent_list.item(i).text() for i in range(model_panel.recent_list.count())] == [
        str(hf), str(gguf)]
    assert json.loads((tmp_path / "state" / "recent.json").read_text()) == {"recent": [str(hf), str(gguf)]}
    again = ModelPanel(tmp_path / "state" / "recent.json")
    qtbot.addWidget(again)
    assert again.recent.items == [str(hf), str(gguf)]
    with pytest.raises(ValueError, match="memory_bytes"):
        again.set_loaded({k: v for k, v in loaded_info(gguf).items() if k != "memory_bytes"})


def test_model_recent_double_click_loads(model_panel, models, qtbot):
    gguf, _ = models
    model_panel.set_loaded(loaded_info(gguf))
    with qtbot.waitSignal(model_panel.load_requested) as sig:
        item = model_panel.recent_list.item(0)
        model_panel.recent_list.itemDoubleClicked.emit(item)
    assert sig.args[0]["path"] == str(gguf)


def test_model_error_keeps_previous_model(model_panel, models, qtbot):
    gguf, hf = models
    model_panel.set_loaded(loaded_info(gguf))
    before = model_panel.loaded_label.text()
    model_panel.path_edit.setText(str(hf))
    model_panel.request_load()
    model_panel.show_error("config.json: unsupported architecture 'GPT2LMHeadModel'")
    assert model_panel.error_label.isVisible()
    assert model_panel.error_label.text().startswith("Load failed:") and "GPT2" in model_panel.error_label.text()
    assert model_panel.loaded_label.text() == before and model_panel.load_button.isEnabled()


def test_model_bad_path_shows_error_without_request(model_panel, tmp_path, qtbot):
    for bad, why in ((tmp_path / "nope.gguf", "does not exist"), (tmp_path, "no config.json")):
        model_panel.path_edit.setText(str(bad))
        with qtbot.assertNotEmitted(model_panel.load_requested):
            qtbot.mouseClick(model_panel.load_button, Qt.LeftButton)
        assert why in model_panel.error_label.text() and model_panel.load_button.isEnabled()
    model_panel.path_edit.clear()
    model_panel.draft_edit.setText(str(tmp_path / "draft.txt"))
    (tmp_path / "draft.txt").write_text("x")
    with qtbot.assertNotEmitted(model_panel.load_requested):
        model_panel.request_load()
    assert "draft model" in model_panel.error_label.text()


def test_model_corrupt_recent_file_starts_empty(qtbot, tmp_path):
    path = tmp_path / "recent.json"
    path.write_text("{ broken")
    panel = ModelPanel(path)
    qtbot.addWidget(panel)
    assert panel.recent.items == [] and "unreadable" in panel.error_label.text()
