"""Gemma 3 image preprocessing and prompt layout, as transformers' Gemma3 processor does them with
pan-and-scan off (its default): one resize to size x size (bilinear), rescale, normalize.

The chat template writes `<start_of_image>` where an image goes; the processor replaces it with
`\\n\\n<start_of_image>` + `<image_soft_token>` * mm_tokens_per_image + `<end_of_image>\\n\\n`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from PIL import Image

from engine.vision import image_ops

BOI_TOKEN = "<start_of_image>"
IMAGE_TOKEN = "<image_soft_token>"
EOI_TOKEN = "<end_of_image>"
BEFORE = f"\n\n{BOI_TOKEN}"
AFTER = f"{EOI_TOKEN}\n\n"


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

    @classmethod
    def from_config(cls, config: dict, image_size: int) -> "Gemma3Preprocessor":
        """From a preprocessor_config.json dict; without a size, the vision encoder's image_size."""
        size = config.get("size") or {}
        p = cls(height=int(size.get("height", image_size)), width=int(size.get("width", image_size)))
        if config.get("do_pan_and_scan"):
            raise ValueError("pan-and-scan preprocessing is not supported")
        return image_ops.read_processor_config(p, config, ("do_rescale", "do_normalize"))

    def preprocess(self, image: Image.Image) -> np.ndarray:
        """float32 pixel values [1, 3, height, width] (transformers' pixel_values for one image)."""
        image = image_ops.resize(image_ops.to_rgb(image), self.height, self.width, self.resample)
        factor = self.rescale_factor if self.do_rescale else 1.0
        mean = self.image_mean if self.do_normalize else [0.0, 0.0, 0.0]
        std = self.image_std if self.do_normalize else [1.0, 1.0, 1.0]
        return image_ops.to_pixels(image, factor, mean, std)[None]
