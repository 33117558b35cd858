"""The SigLIP vision transformer in plain PyTorch (gpt-fast style: one module per block, no framework).

Patch embedding (a stride-p convolution), learned position embeddings, pre-norm encoder layers
(bidirectional attention, GELU MLP) and a final layernorm; its output is one hidden state per patch, which a
projector (engine.vision.idefics3, engine.vision.gemma3) turns into language-model embeddings.

Parameter names are transformers' SigLIP names below the vision model's prefix (`embeddings.patch_embedding`,
`encoder.layers.N.self_attn.q_proj`, `post_layernorm`, ...), so an HF checkpoint loads by stripping that
prefix and an mmproj GGUF by renaming (engine.vision.mmproj).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

_ACTIVATIONS = {
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "gelu": F.gelu,
    "quick_gelu": lambda x: x * torch.sigmoid(1.702 * x),
}


# transformers' SiglipVisionConfig defaults
SIGLIP_DEFAULTS = dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=12,
                       image_size=224, patch_size=16, layer_norm_eps=1e-6, hidden_act="gelu_pytorch_tanh",
                       num_channels=3)
# transformers' Idefics3VisionConfig / SmolVLMVisionConfig defaults where they differ
IDEFICS3_DEFAULTS = dict(hidden_size=1152, num_attention_heads=16, patch_size=32)


@dataclass(frozen=True)
class SiglipConfig:
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    image_size: int
    patch_size: int
    layer_norm_eps: float = 1e-6
    hidden_act: str = "gelu_pytorch_tanh"
    num_channels: int = 3

    @classmethod
    def from_hf(cls, vision_config: dict, defaults: dict | None = None) -> "SiglipConfig":
        """From config.json's vision_config; missing keys take `defaults` (the transformers config class's
        defaults for that model type: config.json files leave out what equals them), else SigLIP's."""
        v = {**SIGLIP_DEFAULTS, **(defaults or {}), **vision_config}
        return cls(**{f: type(SIGLIP_DEFAULTS[f])(v[f]) for f in SIGLIP_DEFAULTS})

    @property
    def patches_per_side(self) -> int:
        return self.image_size // self.patch_size


class Attention(nn.Module):
    def __init__(self, c: SiglipConfig):
        super().__init__()
        d = c.hidden_size
        self.n_head = c.num_attention_heads
        self.q_proj, self.k_proj, self.v_proj, self.out_proj = (nn.Linear(d, d) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        q, k, v = (p(x).view(b, n, self.n_head, -1).transpose(1, 2) for p in (self.q_proj, self.k_proj, self.v_proj))
        y = F.scaled_dot_product_attention(q, k, v)
        return self.out_proj(y.transpose(1, 2).reshape(b, n, d))


class MLP(nn.Module):
    def __init__(self, c: SiglipConfig):
        super().__init__()
        self.fc1 = nn.Linear(c.hidden_size, c.intermediate_size)
        self.fc2 = nn.Linear(c.intermediate_size, c.hidden_size)
        self.act = _ACTIVATIONS[c.hidden_act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class EncoderLayer(nn.Module):
    def __init__(self, c: SiglipConfig):
        super().__init__()
        self.layer_norm1 = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps)
        self.self_attn = Attention(c)
        self.layer_norm2 = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps)
        self.mlp = MLP(c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.layer_norm1(x))
        return x + self.mlp(self.layer_norm2(x))


class Embeddings(nn.Module):
    def __init__(self, c: SiglipConfig, fractional_positions: bool):
        super().__init__()
        self.patch_size = c.patch_size
        self.per_side = c.patches_per_side
        self.fractional_positions = fractional_positions
        self.patch_embedding = nn.Conv2d(c.num_channels, c.hidden_size, c.patch_size, stride=c.patch_size)
        self.position_embedding = nn.Embedding(self.per_side**2, c.hidden_size)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        x = self.patch_embedding(pixels).flatten(2).transpose(1, 2)
        nh, nw = pixels.shape[-2] // self.patch_size, pixels.shape[-1] // self.patch_size
        if self.fractional_positions:
            ids = fractional_position_ids(nh, nw, self.per_side)
        else:
            if (nh, nw) != (self.per_side, self.per_side):
                raise ValueError(f"this encoder takes {self.per_side}x{self.per_side} patches, got {nh}x{nw}")
            ids = torch.arange(nh * nw)
        return x + self.position_embedding(ids.to(pixels.device))


def fractional_position_ids(nh: int, nw: int, per_side: int) -> torch.Tensor:
    """Idefics3's NaViT-style positions for an nh x nw patch grid: each patch's fractional coordinate bucketed
    onto the trained per_side x per_side table (the same float32 arithmetic as transformers, so the same ids)."""
    boundaries = torch.arange(1 / per_side, 1.0, 1 / per_side)
    coords = []
    for n in (nh, nw):
        step = 1.0 / torch.tensor([n])
        frac = torch.arange(n, dtype=torch.float32)[None, :] * step[:, None]
        coords.append(torch.bucketize(torch.clamp(frac, max=1.0 - 1e-6), boundaries, right=True)[0])
    return (coords[0][:, None] * per_side + coords[1][None, :]).reshape(-1)


class SiglipVisionTransformer(nn.Module):
    """pixels [B, 3, H, W] -> hidden states [B, (H/p)*(W/p), hidden] after the post layernorm."""

    def __init__(self, c: SiglipConfig, fractional_positions: bool = False):
        super().__init__()
        self.config = c
        self.embeddings = Embeddings(c, fractional_positions)
        self.encoder = nn.Module()
        self.encoder.layers = nn.ModuleList(EncoderLayer(c) for _ in range(c.num_hidden_layers))
        self.post_layernorm = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        x = self.embeddings(pixels)
        for layer in self.encoder.layers:
            x = layer(x)
        return self.post_layernorm(x)
