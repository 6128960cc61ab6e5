"""An image processor needing only Pillow and NumPy (transformers' ``ViTImageProcessor`` needs torchvision).

It is transformers' PIL-backed processor (resize, optional center crop, rescale to [0, 1], normalise) plus a
conversion of each image to the model's channel count, so RGB photos feed a 1-channel model and grey scans a
3-channel one. It reads the ``preprocessor_config.json`` of the ViT, DeiT (resize to 256, center crop 224)
and DINOv2 checkpoints (shortest edge to 256, center crop 224) with the same outputs as transformers' own
processors of those families, and is what ``AutoImageProcessor`` gives for every hf_efficient vision model.
"""

from __future__ import annotations

import numpy as np
from transformers.image_utils import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD, PILImageResampling
from transformers.models.vit.image_processing_pil_vit import ViTImageProcessorPil
from transformers.processing_utils import ImagesKwargs

# ITU-R 601-2 luma, as PIL's Image.convert("L").
_LUMA = np.array([0.299, 0.587, 0.114])
# DeiT and DINOv2 resize to 256 / 224 of the model's image size, then crop its center (their eval transform).
_CROP_MARGIN = 256 / 224


def _family_defaults(config) -> dict:
    """The preprocessing a family's checkpoints are evaluated with, at ``config.image_size``: ViT's (resize
    to the size, 0.5 per channel), DeiT's (resize to 256 / 224 of it, center crop, bicubic, ImageNet
    statistics) and DINOv2's (the shortest edge to 256 / 224 of it, center crop, bicubic, ImageNet
    statistics). Other channel counts than 3 get the mean of ImageNet's per-channel statistics."""
    size, channels = config.image_size, config.num_channels
    if config.model_type not in ("efficient_deit", "efficient_dinov2"):
        return dict(
            size={"height": size, "width": size}, image_mean=[0.5] * channels, image_std=[0.5] * channels
        )
    mean, std = (
        (list(stats) if channels == 3 else [float(np.mean(stats))] * channels)
        for stats in (IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD)
    )
    resized = round(size * _CROP_MARGIN)
    if config.model_type == "efficient_deit":
        resize = {"height": resized, "width": resized}
    else:
        resize = {"shortest_edge": resized}
    return dict(
        size=resize,
        crop_size={"height": size, "width": size},
        do_center_crop=True,
        resample=PILImageResampling.BICUBIC,
        image_mean=mean,
        image_std=std,
    )


class EfficientViTImageProcessorKwargs(ImagesKwargs, total=False):
    """transformers' image-processing keyword arguments plus the channel count images are converted to.

    Declaring ``num_channels`` here makes it a real processor option: ``from_pretrained(path,
    num_channels=1)`` and ``processor(images, num_channels=1)`` take it like ``size`` (an undeclared keyword
    would be set on the instance with transformers' "applied for backward compatibility" warning).
    """

    num_channels: int


class EfficientViTImageProcessor(ViTImageProcessorPil):
    """ViT preprocessing (PIL backend) for images of any channel count.

    Args:
        num_channels: channels the model expects (1 = grey, 3 = RGB); images are converted to it.
        **kwargs: ``ViTImageProcessorPil`` options (``size``, ``image_mean``, ``image_std``, ``resample``).

    Example:
        >>> processor = EfficientViTImageProcessor.for_config(model.config)
        >>> pipe = pipeline("image-classification", model=model, image_processor=processor)
    """

    model_input_names = ["pixel_values"]
    valid_kwargs = EfficientViTImageProcessorKwargs
    num_channels = 3

    def __init__(self, num_channels: int = 3, **kwargs):
        if isinstance(num_channels, bool) or not isinstance(num_channels, int) or num_channels < 1:
            raise ValueError(f"num_channels must be a positive int (1: grey, 3: RGB), got {num_channels!r}")
        for name in ("image_mean", "image_std"):  # ViT's 0.5 per channel, for any channel count
            kwargs[name] = [0.5] * num_channels if kwargs.get(name) is None else kwargs[name]
            values = kwargs[name]
            if isinstance(values, (list, tuple)) and len(values) != num_channels:
                raise ValueError(
                    f"{name} has {len(values)} values but num_channels={num_channels}: give one per channel."
                )
        super().__init__(**kwargs)
        self.num_channels = num_channels

    @classmethod
    def for_config(cls, config, **kwargs) -> EfficientViTImageProcessor:
        """A processor for a model config, giving ``image_size`` square images of ``num_channels`` channels
        with its family's preprocessing: ViT's (resize, mean/std 0.5 per channel), DeiT's and DINOv2's
        (resize, center crop, ImageNet statistics); ``kwargs`` override any of it."""
        return cls(num_channels=config.num_channels, **{**_family_defaults(config), **kwargs})

    @staticmethod
    def _convert_channels(image: np.ndarray, num_channels: int) -> np.ndarray:
        """(c, H, W) channel-first image -> (num_channels, H, W)."""
        channels = image.shape[0]
        if channels in (2, 4) and channels != num_channels:  # grey + alpha (LA), RGBA: drop alpha
            image, channels = image[: channels - 1], channels - 1
        if channels == num_channels:
            return image
        if channels == 3 and num_channels == 1:
            luma = np.tensordot(_LUMA, image.astype(np.float64), axes=1)[None]  # (3, H, W) -> (1, H, W)
            return luma.astype(np.float32 if image.dtype.kind == "f" else image.dtype)
        if channels == 1:
            return np.repeat(image, num_channels, axis=0)  # (1, H, W) -> (C, H, W)
        raise ValueError(
            f"Cannot convert an image of {channels} channels to the model's num_channels={num_channels}."
        )

    def process_image(self, image, *args, **kwargs) -> np.ndarray:
        """transformers' conversion of one image to a channel-first array, with errors that give its shape
        when its channels cannot be told or it has no pixels."""
        try:
            array = super().process_image(image, *args, **kwargs)
        except ValueError as error:
            if "channel dimension" not in str(error):
                raise
            raise ValueError(
                f"Cannot tell the channels of an image of shape {tuple(np.shape(image))}: arrays are read as "
                "(height, width, C) or (C, height, width) with C = 1, 3 or 4 (grey, RGB, RGBA). Convert the "
                "image first (a PIL image in mode L, RGB or RGBA)."
            ) from None
        if 0 in array.shape[1:]:
            raise ValueError(f"An image of shape {tuple(np.shape(image))} has no pixels to resize.")
        return array

    def _preprocess(self, images, *args, num_channels: int | None = None, **kwargs):
        if len(images) == 0:
            raise ValueError("No images to process: pass one image or a non-empty list of images.")
        channels = self.num_channels if num_channels is None else num_channels  # a call's value wins
        return super()._preprocess(
            [self._convert_channels(np.asarray(image), channels) for image in images], *args, **kwargs
        )
