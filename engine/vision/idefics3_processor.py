"""Idefics3 / SmolVLM image preprocessing and prompt layout, as transformers' Idefics3 processor does them.

An image is resized so its longest edge is `size["longest_edge"]` (even short edge, capped at 4096), then
(with splitting on) grown to whole multiples of `max_image_size["longest_edge"]` and cut into square tiles,
row by row, followed by the whole image resized to one tile (the "global" image). Without splitting the image
becomes one square tile. Each tile is one vision-encoder input and becomes `image_seq_len` embeddings.

The prompt text the processor writes for that image (`layout`): per tile
`<fake_token_around_image><row_i_col_j>` + `<image>` * image_seq_len, a newline after each row, then
`\\n<fake_token_around_image><global-img>` + `<image>` * image_seq_len + `<fake_token_around_image>`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from PIL import Image

from engine.vision import image_ops

MAX_IMAGE_SIZE = 4096  # transformers' absolute cap on the resized image's longest edge
FAKE_TOKEN = "<fake_token_around_image>"
IMAGE_TOKEN = "<image>"
GLOBAL_IMAGE_TAG = "<global-img>"


@dataclass
class Idefics3Preprocessor:
    """The settings of preprocessor_config.json that matter, with transformers' class defaults."""

    longest_edge: int = 4 * 364  # size["longest_edge"]: the first resize
    tile_size: int = 364  # max_image_size["longest_edge"]: one vision-encoder input
    do_resize: bool = True
    do_image_splitting: bool = True
    resample: int = image_ops.LANCZOS
    rescale_factor: float = 1 / 255
    do_rescale: bool = True
    do_normalize: bool = True
    image_mean: list[float] = field(default_factory=lambda: [0.5, 0.5, 0.5])
    image_std: list[float] = field(default_factory=lambda: [0.5, 0.5, 0.5])

    @classmethod
    def from_config(cls, config: dict, image_size: int | None = None) -> "Idefics3Preprocessor":
        """From a preprocessor_config.json dict (missing keys keep transformers' defaults, except that the
        tile defaults to the encoder's image_size, and the first resize to four tiles, when given)."""
        p = cls() if image_size is None else cls(longest_edge=4 * image_size, tile_size=image_size)
        size = config.get("size") or {}
        if "longest_edge" in size:
            p.longest_edge = int(size["longest_edge"])
        max_size = config.get("max_image_size") or {}
        if "longest_edge" in max_size:
            p.tile_size = int(max_size["longest_edge"])
        return image_ops.read_processor_config(p, config, ("do_resize", "do_image_splitting", "do_rescale",
                                                           "do_normalize"))

    def tiles(self, image: Image.Image) -> tuple[list[Image.Image], int, int]:
        """The RGB tiles (row by row, then the global image) and the (rows, cols) grid; (0, 0) when unsplit."""
        image = image_ops.to_rgb(image)
        if self.do_resize:
            h, w = _longest_edge_size(image.height, image.width, self.longest_edge)
            image = image_ops.resize(image, h, w, self.resample)
        t = self.tile_size
        if not self.do_image_splitting:
            return [image_ops.resize(image, t, t, self.resample)], 0, 0
        h, w = _multiple_of_tile_size(image.height, image.width, t)
        image = image_ops.resize(image, h, w, self.resample)
        if h <= t and w <= t:
            return [image], 0, 0
        rows, cols = (h - t) // t + 1, (w - t) // t + 1
        frames = [image.crop((c * t, r * t, c * t + t, r * t + t)) for r in range(rows) for c in range(cols)]
        frames.append(image_ops.resize(image, t, t, self.resample))
        return frames, rows, cols

    def preprocess(self, image: Image.Image) -> tuple[np.ndarray, int, int]:
        """float32 pixel values [n_tiles, 3, tile, tile] (transformers' pixel_values[0]) and (rows, cols)."""
        frames, rows, cols = self.tiles(image)
        factor = self.rescale_factor if self.do_rescale else 1.0
        mean = self.image_mean if self.do_normalize else [0.0, 0.0, 0.0]
        std = self.image_std if self.do_normalize else [1.0, 1.0, 1.0]
        return np.stack([image_ops.to_pixels(f, factor, mean, std) for f in frames]), rows, cols


def layout_segments(rows: int, cols: int) -> list[tuple[str, str]]:
    """(text before, text after) each tile's run of `<image>` tokens, in tile order; joined with the runs,
    they are the text Idefics3Processor puts in place of one `<image>` in the prompt."""
    if rows == 0 and cols == 0:
        return [(FAKE_TOKEN + GLOBAL_IMAGE_TAG, FAKE_TOKEN)]
    segments = []
    for r in range(rows):
        for c in range(cols):
            newline = "\n" if r > 0 and c == 0 else ""
            segments.append((f"{newline}{FAKE_TOKEN}<row_{r + 1}_col_{c + 1}>", ""))
    segments.append((f"\n\n{FAKE_TOKEN}{GLOBAL_IMAGE_TAG}", FAKE_TOKEN))
    return segments


def image_seq_len(image_size: int, patch_size: int, scale_factor: int) -> int:
    """Embeddings per tile: the patch grid shrunk by the pixel shuffle (the processor's image_seq_len rule)."""
    return int(((image_size // patch_size) ** 2) / (scale_factor**2))


def _longest_edge_size(height: int, width: int, max_len: int) -> tuple[int, int]:
    """transformers' resize rule: longest edge to max_len, the other kept in ratio and made even, then the
    whole scaled below MAX_IMAGE_SIZE."""
    aspect = width / height
    if width >= height:
        width = max_len
        height = int(width / aspect)
        height += height % 2
    else:
        height = max_len
        width = int(height * aspect)
        width += width % 2
    height, width = max(height, 1), max(width, 1)
    aspect = width / height
    if width >= height and width > MAX_IMAGE_SIZE:
        width, height = MAX_IMAGE_SIZE, int(MAX_IMAGE_SIZE / aspect)
    elif height > width and height > MAX_IMAGE_SIZE:
        height, width = MAX_IMAGE_SIZE, int(MAX_IMAGE_SIZE * aspect)
    return max(height, 1), max(width, 1)


def _multiple_of_tile_size(height: int, width: int, tile: int) -> tuple[int, int]:
    """transformers' resize_for_vision_encoder: both edges up to whole tiles, the ratio kept on the way."""
    aspect = width / height
    if width >= height:
        width = math.ceil(width / tile) * tile
        height = math.ceil(int(width / aspect) / tile) * tile
    else:
        height = math.ceil(height / tile) * tile
        width = math.ceil(int(height * aspect) / tile) * tile
    return height, width
