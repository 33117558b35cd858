"""Gemma 3's pan-and-scan against transformers: with `do_pan_and_scan` in preprocessor_config.json, a wide or
tall image is read whole and as 2..max crops along its long side. transformers' Gemma3ImageProcessorPil is
the oracle for the crops' pixel values (and their count), Gemma3Processor.replace_image_token for the prompt
text, and the full Gemma3ForConditionalGeneration for the logits of a chat with such an image (each crop's
run of image tokens attending both ways, as transformers groups them).

Tolerances: pixels equal to 1e-6 (same Pillow resizes, same float steps); embeddings and logits as in
test_vision / test_vlm_text (float32, summation order only).
"""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image

from engine import Model, Tokenizer, image_prompt, image_token_count, load_vision
from engine.generator.embeddings import FIRST_ID
from engine.vision.gemma3_processor import Gemma3Preprocessor
from tests.engine.test_vlm_text import ATOL, RTOL, all_logits, chat
from tests.tiny_vlms import GEMMA3_IMAGE_TOKENS, IMAGE_SIZE, write_tiny_gemma3_vlm

PAS = dict(do_pan_and_scan=True, pan_and_scan_min_crop_size=32, pan_and_scan_max_num_crops=4,
           pan_and_scan_min_ratio_to_activate=1.2)
# (width, height) -> crops transformers makes: wide, tall, capped at 4, a narrower last crop, too square,
# crops that would be under the minimum size, square
SIZES = {(200, 60): 3, (50, 130): 3, (300, 40): 4, (101, 45): 2, (66, 60): 0, (20, 70): 0, (64, 64): 0}


def picture(w: int, h: int, seed: int = 0) -> Image.Image:
    return Image.fromarray(np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8))


@pytest.fixture(scope="module")
def gemma3(tmp_path_factory):
    from transformers import Gemma3ImageProcessorPil

    path, hf = write_tiny_gemma3_vlm(tmp_path_factory.mktemp("pas") / "gemma3")
    processor = Gemma3ImageProcessorPil(size={"height": IMAGE_SIZE, "width": IMAGE_SIZE}, **PAS)
    processor.save_pretrained(path)
    return path, hf, processor


def hf_layout(n_crops: int) -> str:
    """transformers' own Gemma3Processor.replace_image_token (built without a tokenizer)."""
    from transformers import Gemma3Processor

    p = Gemma3Processor.__new__(Gemma3Processor)
    p.full_image_sequence = f"\n\n<start_of_image>{'<image_soft_token>' * GEMMA3_IMAGE_TOKENS}<end_of_image>\n\n"
    return p.replace_image_token({"num_crops": [n_crops]}, 0)


def test_crops_pixels_and_prompt_text_match_transformers(gemma3):
    path, hf, processor = gemma3
    encoder = load_vision(path)
    assert encoder.preprocessor.do_pan_and_scan
    for (w, h), n_crops in SIZES.items():
        img = picture(w, h)
        ref = processor(images=[img], return_tensors="pt")
        assert ref["num_crops"].tolist() == [n_crops], (w, h)
        pixels, _ = encoder.preprocess(img)
        assert pixels.shape == tuple(ref["pixel_values"].shape), (w, h)
        np.testing.assert_allclose(pixels, ref["pixel_values"].numpy(), rtol=0, atol=1e-6, err_msg=str((w, h)))
        parts = encoder.encode(img)
        assert encoder.layout(parts) == hf_layout(n_crops), (w, h)
        with torch.no_grad():
            ref_emb = hf.get_image_features(pixel_values=ref["pixel_values"]).pooler_output
        torch.testing.assert_close(torch.cat([p.embeddings for p in parts]),
                                   ref_emb.reshape(-1, ref_emb.shape[-1]), rtol=0, atol=1e-5)


def test_off_unless_the_config_asks(tmp_path):
    """transformers' default (do_pan_and_scan unset): one input per image, however wide."""
    from transformers import Gemma3ImageProcessorPil

    Gemma3ImageProcessorPil(size={"height": IMAGE_SIZE, "width": IMAGE_SIZE}).save_pretrained(tmp_path)
    plain = Gemma3Preprocessor.from_config(json.loads((tmp_path / "preprocessor_config.json").read_text()), 64)
    assert not plain.do_pan_and_scan and plain.preprocess(picture(200, 60)).shape[0] == 1


@pytest.mark.parametrize("size", [(200, 60), (50, 130)])
def test_a_chat_with_a_pan_and_scan_image_matches_the_full_model(gemma3, size):
    path, hf, processor = gemma3
    model, tok = Model.load(path, device="cpu", dtype=torch.float32), Tokenizer.load(path)
    img = picture(*size, seed=3)
    ids, embs = image_prompt(chat(img, "Describe it."), tok, load_vision(path), cache=None)
    ids = ids[0].tolist()
    assert sum(t >= FIRST_ID for t in ids) == (1 + SIZES[size]) * GEMMA3_IMAGE_TOKENS
    text = tok.decode([t if t < FIRST_ID else tok.token_to_id("<image_soft_token>") for t in ids], True)
    assert hf_layout(SIZES[size]) + "Describe it." in text
    vision = load_vision(path)  # what the app prices an attached image at: the same tokens
    layout_ids = tok.encode(hf_layout(SIZES[size]), encode_special_tokens=True)
    assert image_token_count(img, tok, vision) == layout_ids.shape[1]
    image_id = hf.config.image_token_id
    hf_ids = torch.tensor([[image_id if t >= FIRST_ID else t for t in ids]])
    pv = processor(images=[img], return_tensors="pt")["pixel_values"]
    with torch.no_grad():
        ref = hf(input_ids=hf_ids, pixel_values=pv, token_type_ids=(hf_ids == image_id).long()).logits[0]
    torch.testing.assert_close(all_logits(model, ids, embs), ref, atol=ATOL, rtol=RTOL)
