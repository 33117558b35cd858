"""`VisionEncoder`: a PIL image in, the language model's image embeddings and their prompt layout out.

`encode(image)` returns one `ImageTokens` per run of placeholder tokens the model's processor writes for the
image (Idefics3: one per tile, then the global image; Gemma 3: the image, then one per pan-and-scan crop).
Each carries the text around its run and the run's embeddings; `layout(parts)` is the whole text that
replaces the chat template's image marker, with placeholders exactly where the embeddings go. Which kind
of model it is decides the preprocessing (engine.vision.idefics3_processor, engine.vision.gemma3_processor)
and the network (engine.vision.idefics3, engine.vision.gemma3); where the weights came from (HF folder or
mmproj GGUF) does not matter past loading.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np
import torch
from PIL import Image

from engine.vision import gemma3_processor, idefics3_processor, image_ops
from engine.vision.gemma3 import Gemma3Vision
from engine.vision.idefics3 import Idefics3Vision
from engine.vision.siglip import SiglipConfig

IDEFICS3, GEMMA3 = "idefics3", "gemma3"
KINDS = (IDEFICS3, GEMMA3)


@dataclass(frozen=True)
class ImageTokens:
    """One run of image placeholders: `before` + placeholder * n_tokens + `after`, and the embeddings
    [n_tokens, text hidden] that replace the placeholders in the language model's input."""

    before: str
    placeholder: str
    embeddings: torch.Tensor
    after: str = ""

    @property
    def n_tokens(self) -> int:
        return int(self.embeddings.shape[0])

    @property
    def text(self) -> str:
        return self.before + self.placeholder * self.n_tokens + self.after


@dataclass(frozen=True)
class ProjectorShape:
    """What the projector needs beyond SigLIP: the language model's hidden size and the kind's own number
    (Idefics3: pixel-shuffle scale factor; Gemma 3: mm_tokens_per_image)."""

    kind: str
    text_hidden: int
    scale_factor: int = 2
    mm_tokens_per_image: int = 256


class VisionEncoder:
    """A loaded vision encoder + projector + preprocessor. Build it with engine.vision.load_vision."""

    def __init__(self, shape: ProjectorShape, siglip: SiglipConfig, state: dict[str, torch.Tensor],
                 preprocessor_config: dict, identity: str, image_token_id: int | None = None,
                 device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32):
        if shape.kind not in KINDS:
            raise ValueError(f"unknown vision projector kind {shape.kind!r}")
        self.kind = shape.kind
        self.siglip = siglip
        self.text_hidden = shape.text_hidden
        self.image_token_id = image_token_id  # the placeholder's id when the HF config names it
        self.identity = identity
        if self.kind == IDEFICS3:
            self.module = Idefics3Vision(siglip, shape.text_hidden, shape.scale_factor)
            self.preprocessor = idefics3_processor.Idefics3Preprocessor.from_config(
                preprocessor_config, siglip.image_size)
            self.marker, self.placeholder = idefics3_processor.IMAGE_TOKEN, idefics3_processor.IMAGE_TOKEN
            self.tokens_per_tile = idefics3_processor.image_seq_len(
                self.preprocessor.tile_size, siglip.patch_size, shape.scale_factor)
        else:
            self.module = Gemma3Vision(siglip, shape.text_hidden, shape.mm_tokens_per_image)
            self.preprocessor = gemma3_processor.Gemma3Preprocessor.from_config(
                preprocessor_config, siglip.image_size)
            self.marker, self.placeholder = gemma3_processor.BOI_TOKEN, gemma3_processor.IMAGE_TOKEN
            self.tokens_per_tile = shape.mm_tokens_per_image
        missing, unexpected = self.module.load_state_dict(state, strict=False)
        if missing or unexpected:
            raise ValueError(f"vision weights do not match: missing {missing[:5]}, unexpected {unexpected[:5]}")
        self.module.to(device=device, dtype=dtype).eval()
        self.device, self.dtype = torch.device(device), dtype

    def preprocess(self, image: Image.Image) -> tuple[np.ndarray, list[tuple[str, str]]]:
        """float32 pixel values [n, 3, H, W] and the (before, after) texts of each input's placeholder run."""
        if self.kind == IDEFICS3:
            pixels, rows, cols = self.preprocessor.preprocess(image)
            return pixels, idefics3_processor.layout_segments(rows, cols)
        pixels = self.preprocessor.preprocess(image)
        return pixels, gemma3_processor.layout_segments(pixels.shape[0] - 1)

    @torch.inference_mode()
    def embed(self, pixels: np.ndarray) -> torch.Tensor:
        """Pixel values [n, 3, H, W] -> embeddings [n, tokens per input, text hidden] (the encoder's dtype)."""
        x = torch.from_numpy(np.ascontiguousarray(pixels)).to(device=self.device, dtype=self.dtype)
        return self.module(x)

    def encode(self, image: Image.Image) -> list[ImageTokens]:
        """The image's placeholder runs with their embeddings, in prompt order."""
        pixels, segments = self.preprocess(image)
        embeddings = self.embed(pixels)
        return [ImageTokens(before, self.placeholder, e, after) for (before, after), e in zip(segments, embeddings)]

    @staticmethod
    def layout(parts: list[ImageTokens]) -> str:
        """The text that replaces one image marker in the prompt (what the HF processor writes)."""
        return "".join(p.text for p in parts)

    def content_hash(self, image: Image.Image) -> str:
        """Names the embeddings this encoder gives the image: its decoded RGB pixels and this encoder."""
        return content_hash(image, self.identity)


def content_hash(image: Image.Image, encoder_identity: str = "") -> str:
    """sha256 hex of the image's decoded RGB pixels (as the preprocessors see them) and an encoder identity;
    equal pixels under the same encoder give equal embeddings, so a cache may key on it."""
    rgb = image_ops.to_rgb(image)
    h = hashlib.sha256()
    h.update(f"{encoder_identity}\0{rgb.width}x{rgb.height}\0".encode())
    h.update(rgb.tobytes())
    return h.hexdigest()
