"""engine.vision against transformers: tiny random Idefics3 and Gemma 3 models saved with save_pretrained,
their PIL image processors as the preprocessing oracle and get_image_features as the embedding oracle.

Embedding tolerance (float32): both sides run the same float32 operations (conv, layernorm, attention, GELU,
pixel shuffle / pooling, projection) but through different kernels (SDPA vs transformers' attention path,
different reduction orders could differ), so they agree to a few ulps of the activations per layer: observed
bit-identical on this CPU, outputs of magnitude ~3-10; 1e-5 leaves room for another kernel order and still
catches any wrong step (a missing norm, a wrong position id, a transposed shuffle move outputs by O(1)).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from engine.vision import ImageTokens, load_vision
from engine.vision.siglip import fractional_position_ids

VISION = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, patch_size=4,
              layer_norm_eps=1e-6)
TEXT_HIDDEN = 48
ATOL = 1e-5


def _randomize(model: torch.nn.Module, seed: int) -> None:
    """Weights with spread (norm weights near 1, random biases): no zero projector, no near-identity norm."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g)
            if "norm" in name and name.endswith("weight") and "soft_emb" not in name:
                p.copy_(1 + 0.2 * noise)
            else:
                p.copy_(0.2 * noise)


def write_idefics3(folder, *, image_size=32, tile=32, longest_edge=96, splitting=True, seed=0, smolvlm=False):
    """A tiny Idefics3ForConditionalGeneration (or SmolVLMForConditionalGeneration, the same network under
    another name) + its PIL image processor in `folder`."""
    import transformers
    from transformers.models.idefics3.image_processing_pil_idefics3 import Idefics3ImageProcessorPil
    from transformers.models.smolvlm.image_processing_pil_smolvlm import SmolVLMImageProcessorPil

    family = "SmolVLM" if smolvlm else "Idefics3"
    text = dict(model_type="llama", hidden_size=TEXT_HIDDEN, intermediate_size=64, num_hidden_layers=1,
                num_attention_heads=4, num_key_value_heads=2, vocab_size=300)
    config = getattr(transformers, f"{family}Config")(vision_config=dict(VISION, image_size=image_size),
                                                      text_config=text, scale_factor=2)
    model = getattr(transformers, f"{family}ForConditionalGeneration")(config).eval()
    _randomize(model, seed)
    model.save_pretrained(folder)
    processor = SmolVLMImageProcessorPil if smolvlm else Idefics3ImageProcessorPil
    processor(size={"longest_edge": longest_edge}, max_image_size={"longest_edge": tile},
              do_image_splitting=splitting, image_mean=[0.48, 0.45, 0.41],
              image_std=[0.27, 0.26, 0.28]).save_pretrained(folder)
    return folder


def write_gemma3(folder, *, image_size=64, mm_tokens=16, seed=0):
    """A tiny Gemma3ForConditionalGeneration (16x16 patches pooled to 4x4) + its PIL image processor."""
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration
    from transformers.models.gemma3.image_processing_pil_gemma3 import Gemma3ImageProcessorPil

    text = dict(hidden_size=TEXT_HIDDEN, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
                num_key_value_heads=2, head_dim=16, vocab_size=300)
    config = Gemma3Config(vision_config=dict(VISION, image_size=image_size, vision_use_head=False),
                          text_config=text, mm_tokens_per_image=mm_tokens)
    model = Gemma3ForConditionalGeneration(config).eval()
    _randomize(model, seed)
    model.save_pretrained(folder)
    Gemma3ImageProcessorPil(size={"height": image_size, "width": image_size}).save_pretrained(folder)
    return folder


def sample_images() -> dict[str, Image.Image]:
    """Odd sizes, wide and tall, small (upscaled) and large (split), and the modes a user's file may have."""
    rng = np.random.RandomState(7)
    rgb = lambda h, w: Image.fromarray(rng.randint(0, 256, (h, w, 3), dtype=np.uint8))  # noqa: E731
    rgba = Image.fromarray(rng.randint(0, 256, (41, 29, 4), dtype=np.uint8), "RGBA")
    return {
        "small-odd": rgb(23, 37),
        "wide-split": rgb(53, 101),
        "tall-split": rgb(121, 45),
        "square": rgb(64, 64),
        "rgba": rgba,
        "gray": Image.fromarray(rng.randint(0, 256, (30, 50), dtype=np.uint8), "L"),
        "palette": rgb(33, 19).convert("P"),
    }


IMAGES = sample_images()


@pytest.fixture(scope="module")
def idefics3_folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("vlm")
    return {
        "split": write_idefics3(root / "idefics3"),
        # tiles smaller than the encoder's image size: positions are bucketed fractions, not a plain range
        "small-tiles": write_idefics3(root / "idefics3-small", tile=24, longest_edge=80, seed=1),
        "no-split": write_idefics3(root / "idefics3-nosplit", splitting=False, seed=2),
        "smolvlm": write_idefics3(root / "smolvlm", longest_edge=112, seed=3, smolvlm=True),
    }


@pytest.fixture(scope="module")
def gemma3_folder(tmp_path_factory):
    return write_gemma3(tmp_path_factory.mktemp("vlm") / "gemma3")


def _hf_idefics3(folder):
    from transformers import AutoImageProcessor, AutoModelForImageTextToText

    return AutoImageProcessor.from_pretrained(folder), AutoModelForImageTextToText.from_pretrained(folder).eval()


def _hf_layout(rows: int, cols: int, seq_len: int) -> str:
    """transformers' own Idefics3Processor.replace_image_token (built without a tokenizer)."""
    from transformers import Idefics3Processor

    p = Idefics3Processor.__new__(Idefics3Processor)
    p.fake_image_token, p.image_token, p.global_image_tag = "<fake_token_around_image>", "<image>", "<global-img>"
    p.image_seq_len = seq_len
    return p.replace_image_token({"rows": [[rows]], "cols": [[cols]]}, 0)


@pytest.mark.parametrize("variant", ["split", "small-tiles", "no-split", "smolvlm"])
def test_idefics3_matches_transformers(idefics3_folders, variant):
    folder = idefics3_folders[variant]
    processor, model = _hf_idefics3(folder)
    assert type(processor).__name__.endswith("ImageProcessorPil")  # Pillow resizing, as ours
    encoder = load_vision(folder)
    per_tile = 9 if variant == "small-tiles" else 16  # (tile / patch)^2 / scale_factor^2
    assert encoder.kind == "idefics3" and encoder.tokens_per_tile == per_tile
    shapes = set()
    for name, image in IMAGES.items():
        hf = processor(images=[image], return_tensors="pt", return_row_col_info=True)
        pixels, segments = encoder.preprocess(image)
        ref = hf["pixel_values"][0].numpy()
        assert pixels.shape == ref.shape, name
        np.testing.assert_allclose(pixels, ref, rtol=0, atol=1e-6, err_msg=name)
        assert hf["pixel_attention_mask"].all()  # one image alone: no padding, so no mask to carry
        shapes.add(pixels.shape[0])

        parts = encoder.encode(image)
        assert all(isinstance(p, ImageTokens) and p.n_tokens == per_tile for p in parts)
        rows, cols = hf["rows"][0][0], hf["cols"][0][0]
        assert encoder.layout(parts) == _hf_layout(rows, cols, per_tile), name

        with torch.no_grad():
            ref_emb = model.get_image_features(pixel_values=hf["pixel_values"],
                                               pixel_attention_mask=hf["pixel_attention_mask"]).pooler_output[0]
        ours = torch.cat([p.embeddings for p in parts])
        assert ours.shape == ref_emb.shape == (pixels.shape[0] * per_tile, TEXT_HIDDEN)
        assert ref_emb.abs().max() > 0.1  # a real signal, not a zeroed projector
        torch.testing.assert_close(ours, ref_emb, rtol=0, atol=ATOL, msg=name)
    if variant == "no-split":
        assert shapes == {1}
    else:
        assert max(shapes) > 1  # some images were split into tiles + the global image


def test_gemma3_matches_transformers(gemma3_folder):
    from transformers import AutoImageProcessor, Gemma3ForConditionalGeneration

    processor = AutoImageProcessor.from_pretrained(gemma3_folder)
    assert type(processor).__name__ == "Gemma3ImageProcessorPil"
    model = Gemma3ForConditionalGeneration.from_pretrained(gemma3_folder).eval()
    encoder = load_vision(gemma3_folder)
    assert encoder.kind == "gemma3" and encoder.marker == "<start_of_image>"
    assert encoder.image_token_id == model.config.image_token_id
    for name, image in IMAGES.items():
        ref = processor(images=[image], return_tensors="pt")["pixel_values"]
        pixels, _ = encoder.preprocess(image)
        np.testing.assert_allclose(pixels, ref.numpy(), rtol=0, atol=1e-6, err_msg=name)
        (part,) = encoder.encode(image)
        assert part.text == "\n\n<start_of_image>" + "<image_soft_token>" * 16 + "<end_of_image>\n\n"
        with torch.no_grad():
            ref_emb = model.get_image_features(pixel_values=ref).pooler_output[0]
        assert ref_emb.abs().max() > 0.1
        torch.testing.assert_close(part.embeddings, ref_emb, rtol=0, atol=ATOL, msg=name)


def test_fractional_positions_match_transformers():
    """The bucketed position ids of grids smaller and larger than the trained one, against Idefics3's own
    embeddings module (its patch mask all ones, as for a lone image)."""
    from transformers.models.idefics3.configuration_idefics3 import Idefics3VisionConfig
    from transformers.models.idefics3.modeling_idefics3 import Idefics3VisionEmbeddings

    per_side = 7
    emb = Idefics3VisionEmbeddings(Idefics3VisionConfig(image_size=per_side * 2, patch_size=2, hidden_size=4))
    with torch.no_grad():
        emb.position_embedding.weight.copy_(torch.arange(per_side**2, dtype=torch.float32)[:, None].expand(-1, 4))
        emb.patch_embedding.weight.zero_()
        emb.patch_embedding.bias.zero_()
    for nh, nw in [(3, 5), (7, 7), (6, 2), (11, 9)]:
        mask = torch.ones(1, nh, nw, dtype=torch.bool)
        with torch.no_grad():
            ids = emb(torch.zeros(1, 3, nh * 2, nw * 2), mask)[0, :, 0].long()
        assert torch.equal(fractional_position_ids(nh, nw, per_side), ids), (nh, nw)


def test_text_only_folder_has_no_vision(tiny_llama_folder):
    assert load_vision(tiny_llama_folder) is None


def test_content_hash_names_pixels_and_encoder(gemma3_folder, tmp_path):
    encoder = load_vision(gemma3_folder)
    image = IMAGES["square"]
    png = tmp_path / "a.png"
    image.save(png)
    same = Image.open(png)
    assert encoder.content_hash(same) == encoder.content_hash(image)  # decoded pixels, not the container
    changed = image.copy()
    changed.putpixel((0, 0), (0, 0, 0) if image.getpixel((0, 0)) != (0, 0, 0) else (1, 1, 1))
    assert encoder.content_hash(changed) != encoder.content_hash(image)
    from engine.vision import content_hash

    assert content_hash(image, "other encoder") != encoder.content_hash(image)
