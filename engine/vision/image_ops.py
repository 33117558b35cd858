"""Pixel operations shared by the image preprocessors, written to give transformers' PIL backend bit for bit.

transformers' PIL image processors convert to RGB (transparency composited onto white), resize uint8 images
with Pillow, rescale in float64 then cast to float32, and normalize in float32; these functions do the same
steps in the same precision, so a preprocessor built on them reproduces `pixel_values` exactly.
"""

from __future__ import annotations

import numpy as np
from PIL import Image

# Pillow's filter numbers, which are also transformers' PILImageResampling values in preprocessor_config.json.
NEAREST, LANCZOS, BILINEAR, BICUBIC = 0, 1, 2, 3


def to_rgb(image: Image.Image) -> Image.Image:
    """The image as RGB; transparency is composited onto white (what transformers' convert_to_rgb does)."""
    has_alpha = "A" in image.getbands() or image.info.get("transparency") is not None
    if has_alpha:
        rgba = image.convert("RGBA")
        background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(background, rgba).convert("RGB")
    return image.convert("RGB")


def resize(image: Image.Image, height: int, width: int, resample: int) -> Image.Image:
    """Pillow resize of an RGB image to (height, width); Pillow returns a copy when the size is unchanged."""
    return image.resize((width, height), resample=Image.Resampling(resample))


def to_pixels(image: Image.Image, rescale_factor: float, mean, std) -> np.ndarray:
    """RGB image -> float32 [3, H, W]: uint8 * rescale_factor in float64, cast to float32, (x - mean) / std."""
    chw = np.moveaxis(np.asarray(image, dtype=np.uint8), -1, 0)
    x = (chw.astype(np.float64) * rescale_factor).astype(np.float32)
    mean = np.asarray(mean, dtype=np.float32)
    std = np.asarray(std, dtype=np.float32)
    return ((x.T - mean) / std).T


def read_processor_config(p, config: dict, flags: tuple[str, ...]):
    """Set a preprocessor's flags, resample filter, rescale factor and mean/std from a
    preprocessor_config.json dict where the file gives them (transformers' keys); returns `p`."""
    for key in flags:
        if key in config:
            setattr(p, key, bool(config[key]))
    if config.get("resample") is not None:
        p.resample = int(config["resample"])
    if config.get("rescale_factor") is not None:
        p.rescale_factor = float(config["rescale_factor"])
    for key in ("image_mean", "image_std"):
        if config.get(key) is not None:
            value = config[key]
            setattr(p, key, [float(v) for v in (value if isinstance(value, list) else [value] * 3)])
    return p
