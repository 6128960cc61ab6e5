"""The vision families under test, one entry each: transformers' tiny model of the family for every head, the
inputs and labels of each head, and how many prefix tokens come before its patches
(tests/models/vision/test_families.py runs the checks on every family).

A new family is one :class:`VisionFamily` entry in :data:`VISION_FAMILIES`. ViT-MAE's pre-training model
(another config class, random masking) has its own parity test in tests/models/vision/test_modeling.py.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import (
    DeiTConfig,
    DeiTForImageClassification,
    DeiTForImageClassificationWithTeacher,
    DeiTForMaskedImageModeling,
    DeiTModel,
    Dinov2Config,
    Dinov2ForImageClassification,
    Dinov2Model,
    ViTConfig,
    ViTForImageClassification,
    ViTForMaskedImageModeling,
    ViTModel,
)

import hf_efficient
from hf_efficient.models.families import task_of

NUM_LABELS = 3
# 16x16 images of 4x4 patches: a 4x4 grid, which swin_window's 2x2 windows tile (shifted on layer 1)
TINY = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, image_size=16, patch_size=4)


@dataclass(frozen=True)
class VisionFamily:
    """One family: its transformers config and tiny sizes (in the family's own field names), transformers'
    class of every head with ours beside it.

    Attributes:
        name: the family, as tests are named.
        upstream_config: transformers' config class of the family.
        sizes: a tiny model in that config's fields.
        heads: transformers' class -> ours (by name, in ``hf_efficient``).
        num_prefix_tokens: tokens before the patches ([CLS]; DeiT's distillation token).
        always_interpolates: the family resizes its positions for any image size without being asked
            (DINOv2: its forward has no ``interpolate_pos_encoding``).
    """

    name: str
    upstream_config: type
    sizes: dict
    heads: dict[type, str]
    num_prefix_tokens: int = 1
    always_interpolates: bool = False

    def config(self, upstream_class: type, **overrides):
        """transformers' tiny config for ``upstream_class``: classifiers get ``NUM_LABELS``, masked image
        models a stride of one patch (the reconstruction has the image's size)."""
        task = task_of(self.ours(upstream_class)).__name__
        extra = {}
        if task == "AutoModelForImageClassification":
            extra["num_labels"] = NUM_LABELS
        if task == "AutoModelForMaskedImageModeling":
            extra["encoder_stride"] = self.sizes["patch_size"]
        return self.upstream_config(**{**self.sizes, **extra, **overrides})

    def ours(self, upstream_class: type) -> type:
        return getattr(hf_efficient, self.heads[upstream_class])

    def task(self, upstream_class: type) -> str:
        return task_of(self.ours(upstream_class)).__name__

    def inputs(self, upstream_class: type, labels: bool = True, size: tuple[int, int] = (16, 16)) -> dict:
        """Images (3, C, H, W) and the head's labels (a masked image model's ``bool_masked_pos``); the head
        with a teacher takes none (it is inference only)."""
        g = torch.Generator().manual_seed(0)
        channels = self.sizes.get("num_channels", 3)
        inputs = {"pixel_values": torch.randn(3, channels, *size, generator=g)}
        task, name = self.task(upstream_class), self.heads[upstream_class]
        if task == "AutoModelForMaskedImageModeling":
            patches = (size[0] // self.sizes["patch_size"]) * (size[1] // self.sizes["patch_size"])
            inputs["bool_masked_pos"] = torch.rand(3, patches, generator=g) < 0.5
        elif task == "AutoModelForImageClassification" and labels and not name.endswith("WithTeacher"):
            inputs["labels"] = torch.tensor([0, 2, 1])
        return inputs


def randomise(model: torch.nn.Module) -> None:
    """Move every parameter off its initial value (DeiT starts its tokens and positions at zero, DINOv2 its
    LayerScale at one), so a parameter that fails to load, or a branch that is skipped, shows."""
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(0.1 * torch.randn(param.shape, generator=g))


DINOV2_HEADS = {
    Dinov2Model: "EfficientDinov2Model",
    Dinov2ForImageClassification: "EfficientDinov2ForImageClassification",
}

VISION_FAMILIES = {
    family.name: family
    for family in (
        VisionFamily(
            "vit",
            ViTConfig,
            dict(**TINY, intermediate_size=37),
            {
                ViTModel: "EfficientViTModel",
                ViTForImageClassification: "EfficientViTForImageClassification",
                ViTForMaskedImageModeling: "EfficientViTForMaskedImageModeling",
            },
        ),
        VisionFamily(
            "deit",
            DeiTConfig,
            dict(**TINY, intermediate_size=37),
            {
                DeiTModel: "EfficientDeiTModel",
                DeiTForImageClassification: "EfficientDeiTForImageClassification",
                DeiTForImageClassificationWithTeacher: "EfficientDeiTForImageClassificationWithTeacher",
                DeiTForMaskedImageModeling: "EfficientDeiTForMaskedImageModeling",
            },
            num_prefix_tokens=2,
        ),
        VisionFamily(
            "dinov2",
            Dinov2Config,
            dict(**TINY, mlp_ratio=2, layerscale_value=0.5),
            DINOV2_HEADS,
            always_interpolates=True,
        ),
        VisionFamily(  # DINOv2-giant's feed-forward
            "dinov2-swiglu",
            Dinov2Config,
            dict(**TINY, mlp_ratio=4, use_swiglu_ffn=True),
            DINOV2_HEADS,
            always_interpolates=True,
        ),
    )
}
HEAD_CASES = [(family, upstream) for family in VISION_FAMILIES.values() for upstream in family.heads]
