"""Tiny EfficientViT / ViT-MAE models (hidden 32, 2 layers, 16x16 images, 4x4 patches) and random images."""

from __future__ import annotations

import torch

from hf_efficient import EfficientViTConfig

from ...attention.helpers import small_config

TINY_VIT = dict(
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=37,
    image_size=16,
    patch_size=4,
)
TINY_DECODER = dict(
    decoder_hidden_size=16,
    decoder_num_hidden_layers=2,
    decoder_num_attention_heads=2,
    decoder_intermediate_size=20,
)


def attention_config(attention_type: str) -> dict:
    """The type's small_config; swin_window gets 2x2 windows so the 4x4 grid has four, shifted on layer 1."""
    if attention_type == "swin_window":
        return {"window_size": 2}
    return small_config(attention_type)


def tiny_config(attention_type: str = "full", **overrides) -> EfficientViTConfig:
    values = {**TINY_VIT, **TINY_DECODER, "attention_type": attention_type}
    values["attention_config"] = attention_config(attention_type)
    return EfficientViTConfig(**{**values, **overrides})


def images(b: int = 2, channels: int = 3, size: int = 16, seed: int = 0) -> torch.Tensor:
    return torch.randn(b, channels, size, size, generator=torch.Generator().manual_seed(seed))


def mae_noise(b: int = 2, n: int = 16, seed: int = 1) -> torch.Tensor:
    return torch.rand(b, n, generator=torch.Generator().manual_seed(seed))
