"""Gemma 3's vision side: SigLIP, then Gemma3MultiModalProjector (average pool to mm_tokens_per_image,
soft-embedding RMSNorm, linear projection).

The RMSNorm is Gemma's: x / rms(x) * (1 + w). `mm_soft_emb_norm.weight` here holds w as transformers stores
it; llama.cpp's mmproj stores 1 + w, and engine.vision.mmproj subtracts the 1 on reading.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.vision.siglip import SiglipConfig, SiglipVisionTransformer


class SoftEmbNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.zeros(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (y * (1.0 + self.weight.float())).type_as(x)


class Gemma3Projector(nn.Module):
    def __init__(self, c: SiglipConfig, text_hidden: int, mm_tokens_per_image: int):
        super().__init__()
        self.patches_per_side = c.patches_per_side
        tokens_per_side = int(mm_tokens_per_image**0.5)
        self.kernel = self.patches_per_side // tokens_per_side
        self.mm_input_projection_weight = nn.Parameter(torch.zeros(c.hidden_size, text_hidden))
        self.mm_soft_emb_norm = SoftEmbNorm(c.hidden_size, c.layer_norm_eps)

    def forward(self, states: torch.Tensor) -> torch.Tensor:
        b, _, d = states.shape
        grid = states.transpose(1, 2).reshape(b, d, self.patches_per_side, self.patches_per_side)
        pooled = F.avg_pool2d(grid.contiguous(), self.kernel, self.kernel).flatten(2).transpose(1, 2)
        return torch.matmul(self.mm_soft_emb_norm(pooled), self.mm_input_projection_weight).type_as(states)


class Gemma3Vision(nn.Module):
    """images [N, 3, S, S] -> embeddings [N, mm_tokens_per_image, text hidden]. Parameter names as
    transformers saves them: `vision_tower.*`, `multi_modal_projector.*`."""

    def __init__(self, c: SiglipConfig, text_hidden: int, mm_tokens_per_image: int):
        super().__init__()
        self.vision_tower = SiglipVisionTransformer(c)
        self.multi_modal_projector = Gemma3Projector(c, text_hidden, mm_tokens_per_image)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        return self.multi_modal_projector(self.vision_tower(pixels))
