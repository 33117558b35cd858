"""Gemma 3 image preprocessing and prompt layout, as transformers' Gemma3 image processor and Gemma3Processor
do them: one resize to size x size (bilinear), rescale, normalize; with pan-and-scan on
(`do_pan_and_scan` in preprocessor_config.json), a wide or tall image is also cut into 2..max crops along
its long side, each read the same way after the whole image.

The chat template writes `<start_of_image>` where an image goes; the processor replaces it with
`\\n\\n<start_of_image>` + `<image_soft_token>` * mm_tokens_per_image + `<end_of_image>\\n\\n`, and for an
image with crops with "Here is the original image " + that + " and here are some crops to help you see
better " + that once per crop, joined by spaces.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field

import numpy as np
from PIL import Image

from engine.vision import image_ops

BOI_TOKEN = "<start_of_image>"
IMAGE_TOKEN = "<image_soft_token>"
EOI_TOKEN = "<end_of_image>"
BEFORE = f"\n\n{BOI_TOKEN}"
AFTER = f"{EOI_TOKEN}\n\n"
ORIGINAL, CROPS = "Here is the original image ", " and here are some crops to help you see better "


@dataclass
class Gemma3Preprocessor:
    height: int = 896
    width: int = 896
    resample: int = image_ops.BILINEAR
    rescale_factor: float = 1 / 255
    do_rescale: bool = True
    do_normalize: bool = True
    image_mean: list[float] = field(default_factory=lambda: [0.5, 0.5, 0.5])
    image_std: list[float] = field(default_factory=lambda: [0.5, 0.5, 0.5])
    # pan-and-scan, with Gemma3Processor's defaults for what the config leaves out
    do_pan_and_scan: bool = False
    pan_and_scan_min_crop_size: int = 256
    pan_and_scan_max_num_crops: int = 4
    pan_and_scan_min_ratio_to_activate: float = 1.2

    @classmethod
    def from_config(cls, config: dict, image_size: int) -> "Gemma3Preprocessor":
        """From a preprocessor_config.json dict; without a size, the vision encoder's image_size."""
        size = config.get("size") or {}
        p = cls(height=int(size.get("height", image_size)), width=int(size.get("width", image_size)))
        for key, kind in (("pan_and_scan_min_crop_size", int), ("pan_and_scan_max_num_crops", int),
                          ("pan_and_scan_min_ratio_to_activate", float)):
            if config.get(key) is not None:
                setattr(p, key, kind(config[key]))
        return image_ops.read_processor_config(p, config, ("do_rescale", "do_normalize", "do_pan_and_scan"))

    def crops(self, image: Image.Image) -> list[Image.Image]:
        """The pan-and-scan crops of an RGB image (none where it is off, the image not wide or tall enough,
        or a crop would be under the minimum size), row by row; transformers' pan_and_scan, whose numpy
        slices stop at the image's edge (so does the box here: a last crop may be narrower)."""
        if not self.do_pan_and_scan:
            return []
        width, height = image.size
        long, short = max(width, height), min(width, height)
        if long / short < self.pan_and_scan_min_ratio_to_activate:
            return []
        n = min(int(math.floor(long / short + 0.5)), int(math.floor(long / self.pan_and_scan_min_crop_size)))
        n = min(self.pan_and_scan_max_num_crops, max(2, n))
        n_w, n_h = (n, 1) if width >= height else (1, n)
        crop_w, crop_h = int(math.ceil(width / n_w)), int(math.ceil(height / n_h))
        if min(crop_w, crop_h) < self.pan_and_scan_min_crop_size:
            return []
        return [image.crop((x, y, min(x + crop_w, width), min(y + crop_h, height)))
                for y, x in itertools.product(range(0, n_h * crop_h, crop_h), range(0, n_w * crop_w, crop_w))]

    def preprocess(self, image: Image.Image) -> np.ndarray:
        """float32 pixel values [1 + crops, 3, height, width] (transformers' pixel_values for one image: the
        whole image, then its crops)."""
        image = image_ops.to_rgb(image)
        factor = self.rescale_factor if self.do_rescale else 1.0
        mean = self.image_mean if self.do_normalize else [0.0, 0.0, 0.0]
        std = self.image_std if self.do_normalize else [1.0, 1.0, 1.0]
        return np.stack([image_ops.to_pixels(image_ops.resize(frame, self.height, self.width, self.resample),
                                             factor, mean, std) for frame in [image, *self.crops(image)]])


def layout_segments(n_crops: int) -> list[tuple[str, str]]:
    """(text before, text after) each input's run of `<image_soft_token>`, the whole image first; joined with
    the runs, they are what Gemma3Processor puts in place of one `<start_of_image>`."""
    if not n_crops:
        return [(BEFORE, AFTER)]
    return [(ORIGINAL + BEFORE, AFTER + CROPS)] + [(BEFORE, AFTER + (" " if i < n_crops - 1 else ""))
                                                   for i in range(n_crops)]
