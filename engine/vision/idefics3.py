"""The Idefics3 / SmolVLM connector: pixel shuffle then one linear projection into the language model.

The pixel shuffle folds each scale_factor x scale_factor block of patch states into one vector
(hidden * scale_factor^2), cutting the tokens per tile by scale_factor^2; `modality_projection.proj` (no bias)
maps that to the language model's hidden size. Same arithmetic as transformers' Idefics3Connector.
"""

from __future__ import annotations

import torch
from torch import nn

from engine.vision.siglip import SiglipConfig, SiglipVisionTransformer


def pixel_shuffle(x: torch.Tensor, scale_factor: int) -> torch.Tensor:
    """[B, seq, d] (a square patch grid) -> [B, seq / s^2, d * s^2], blocks in transformers' order."""
    b, seq, d = x.shape
    side = int(seq**0.5)
    s = scale_factor
    x = x.view(b, side, side // s, d * s)
    x = x.permute(0, 2, 1, 3).reshape(b, side // s, side // s, d * s * s)
    return x.permute(0, 2, 1, 3).reshape(b, seq // (s * s), d * s * s)


class ModalityProjection(nn.Module):
    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.proj = nn.Linear(in_features, out_features, bias=False)


class Idefics3Connector(nn.Module):
    def __init__(self, vision_hidden: int, text_hidden: int, scale_factor: int):
        super().__init__()
        self.scale_factor = scale_factor
        self.modality_projection = ModalityProjection(vision_hidden * scale_factor**2, text_hidden)

    def forward(self, states: torch.Tensor) -> torch.Tensor:
        return self.modality_projection.proj(pixel_shuffle(states, self.scale_factor))


class Idefics3Vision(nn.Module):
    """tiles [N, 3, t, t] -> embeddings [N, image_seq_len, text hidden]. Parameter names as transformers
    saves them below `model.`: `vision_model.*`, `connector.*`."""

    def __init__(self, c: SiglipConfig, text_hidden: int, scale_factor: int):
        super().__init__()
        self.vision_model = SiglipVisionTransformer(c, fractional_positions=True)
        self.connector = Idefics3Connector(c.hidden_size, text_hidden, scale_factor)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        return self.connector(self.vision_model(pixels))
