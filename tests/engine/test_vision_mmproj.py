"""llama.cpp's mmproj GGUF: written from a tiny HF VLM by tools.models.mmproj_gguf, read by engine.vision.mmproj,
it gives the HF folder's embeddings, and load_vision finds it beside a model GGUF (LM Studio's layout).

Tolerances: F32 holds the same float32 weights (Gemma 3's soft-embedding norm as 1 + w, read back as
(1 + w) - 1: at most one rounding), observed identical; bound 1e-5 on outputs of magnitude ~3-10. F16 rounds
every matrix to 11 significant bits (relative 2^-11 ~ 5e-4 per weight); through two encoder layers and the
projector the observed error is ~5e-4 of the largest output; the bound is 0.5% of it (10x room), while a
wrong or missing tensor moves outputs by their own size.
"""

from __future__ import annotations

import dataclasses

import gguf
import numpy as np
import pytest
import torch

from engine.vision import find_mmproj, load_vision
from engine.vision.mmproj import load_mmproj
from tests.engine.test_vision import IMAGES, write_gemma3, write_idefics3
from tools.models.mmproj_gguf import write_mmproj

KINDS = {"idefics3": write_idefics3, "gemma3": write_gemma3}


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("mmproj")
    return {kind: write(root / kind) for kind, write in KINDS.items()}


def _embeddings(encoder, image) -> torch.Tensor:
    return torch.cat([p.embeddings for p in encoder.encode(image)])


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("dtype", ["f32", "f16"])
def test_mmproj_gives_the_hf_embeddings(folders, tmp_path, kind, dtype):
    path = write_mmproj(folders[kind], tmp_path / f"mmproj-{kind}-{dtype}.gguf", dtype)
    reader = gguf.GGUFReader(str(path))
    assert reader.fields["general.architecture"].contents() == "clip"
    assert reader.fields["clip.projector_type"].contents() == kind
    types = {t.name: t.tensor_type for t in reader.tensors}
    assert "v.blk.1.attn_q.weight" in types and "v.post_ln.weight" in types
    expected_type = gguf.GGMLQuantizationType.F16 if dtype == "f16" else gguf.GGMLQuantizationType.F32
    assert types["v.blk.0.ffn_up.weight"] == expected_type
    assert types["v.blk.0.ln1.weight"] == gguf.GGMLQuantizationType.F32  # 1-D stays F32, as llama.cpp writes

    hf, gg = load_vision(folders[kind]), load_vision(path)
    assert (gg.kind, gg.marker, gg.placeholder, gg.tokens_per_tile) == (hf.kind, hf.marker, hf.placeholder,
                                                                       hf.tokens_per_tile)
    # the preprocessing settings travel in the metadata (mean and std as float32, as normalizing uses them)
    f32 = lambda p: {k: np.float32(v).tolist() if k in ("image_mean", "image_std") else v  # noqa: E731
                     for k, v in dataclasses.asdict(p).items()}
    assert f32(gg.preprocessor) == f32(hf.preprocessor)
    assert gg.identity != hf.identity
    for name, image in IMAGES.items():
        ours, ref = _embeddings(gg, image), _embeddings(hf, image)
        assert [p.text for p in gg.encode(image)] == [p.text for p in hf.encode(image)], name
        bound = 1e-5 if dtype == "f32" else 0.005 * float(ref.abs().max())
        torch.testing.assert_close(ours, ref, rtol=0, atol=bound, msg=name)
        if dtype == "f16":
            assert not torch.equal(ours, ref)  # the F16 file really is rounded


def test_found_beside_a_model_gguf(folders, tiny_llama_folder, tmp_path):
    """LM Studio keeps `mmproj-*.gguf` in the model's folder: the model GGUF's path finds it."""
    from tests.tiny_models import write_tiny_gguf

    model = write_tiny_gguf(tiny_llama_folder, tmp_path / "Tiny-VLM-F32.gguf", tokenizer=False)
    assert load_vision(model) is None  # no projector yet: a text-only model
    (tmp_path / "mmproj-notes.txt").write_text("not a gguf")
    mmproj = write_mmproj(folders["gemma3"], tmp_path / "mmproj-Tiny-VLM-F16.gguf", "f16")
    assert find_mmproj(model) == mmproj
    encoder = load_vision(model)
    assert encoder is not None and encoder.kind == "gemma3"
    image = IMAGES["small-odd"]
    assert torch.equal(_embeddings(encoder, image), _embeddings(load_mmproj(mmproj), image))


def test_an_ollama_blob_without_a_projector_layer_reads_text_only(folders, tmp_path):
    """In Ollama's store only a manifest's projector layer is a model's projector (test_vlm_gguf has one),
    not an mmproj file that happens to lie among the blobs."""
    blobs = tmp_path / "blobs"
    blobs.mkdir()
    model = blobs / "sha256-0123abcd"
    model.write_bytes(b"GGUF")
    write_mmproj(folders["idefics3"], blobs / "mmproj-x.gguf")
    assert load_vision(model) is None


def test_unsupported_projector_is_refused(folders, tmp_path):
    """A projector this package cannot run (llava here) is an error naming it, not a silent text-only model."""
    src = write_mmproj(folders["gemma3"], tmp_path / "src.gguf")
    reader = gguf.GGUFReader(str(src))
    w = gguf.GGUFWriter(str(tmp_path / "mmproj-llava.gguf"), "clip")
    w.add_clip_has_vision_encoder(True)
    w.add_clip_projector_type("mlp")
    for key in ("embedding_length", "feed_forward_length", "block_count", "image_size", "patch_size",
                "projection_dim"):
        w.add_uint32(f"clip.vision.{key}", reader.fields[f"clip.vision.{key}"].contents())
    w.add_uint32("clip.vision.attention.head_count", 4)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ValueError, match="'mlp' is not supported"):
        load_vision(tmp_path / "mmproj-llava.gguf")
