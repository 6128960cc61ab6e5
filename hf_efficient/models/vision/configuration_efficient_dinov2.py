"""Configuration of EfficientDinov2: DINOv2's fields (LayerScale, stochastic depth, the SwiGLU option) and the
attention fields."""

from huggingface_hub.dataclasses import strict

from ...errors import InputError
from .configuration_efficient_vision import EfficientVisionConfig


@strict(accept_kwargs=True)
class EfficientDinov2Config(EfficientVisionConfig):
    """A DINOv2 encoder (Oquab et al. 2023) whose attention is chosen by ``attention_type``. DINOv2's fields
    keep their names and defaults (``patch_size=14``, ``layer_norm_eps=1e-6``, the feed-forward width given
    by ``mlp_ratio``), so a DINOv2 ``config.json`` loads as an ``EfficientDinov2Config``; its backbone
    fields (``out_features``, ``apply_layernorm`` ...) are kept and saved, read by no model here.

    Example:
        >>> config = EfficientDinov2Config(attention_type="longformer", attention_config={"window": 64})
    """

    model_type = "efficient_dinov2"
    compatible_model_types = ("dinov2",)
    weight_shape_fields = (
        "image_size",
        "patch_size",
        "num_channels",
        "hidden_size",
        "mlp_ratio",
        "use_swiglu_ffn",
    )

    patch_size: int = 14
    layer_norm_eps: float = 1e-6
    mlp_ratio: int = 4
    layerscale_value: float = 1.0  # LayerScale's start: every residual branch is scaled by a learned vector
    drop_path_rate: float | int = 0.0  # stochastic depth of every residual branch, in training
    use_swiglu_ffn: bool = False  # the feed-forward of DINOv2-giant: SwiGLU (mlp.weights_in, mlp.weights_out)
    use_mask_token: bool = True  # embeddings.mask_token, for bool_masked_pos
    apply_layernorm: bool = True  # (transformers' Dinov2Backbone)
    reshape_hidden_states: bool = True  # (transformers' Dinov2Backbone)

    @property
    def mlp_hidden_size(self) -> int:
        """The feed-forward's width: ``hidden_size * mlp_ratio``; with SwiGLU two thirds of it rounded up to
        a multiple of 8 (each of the gate and the value halves), as DINOv2's."""
        width = int(self.hidden_size * self.mlp_ratio)
        return (int(width * 2 / 3) + 7) // 8 * 8 if self.use_swiglu_ffn else width

    def validate_dinov2_fields(self):
        """Class validator: a positive feed-forward width and a drop-path probability in [0, 1)."""
        if self.mlp_ratio <= 0:
            raise InputError(
                f"mlp_ratio must be > 0 (the feed-forward is hidden_size * mlp_ratio wide), got "
                f"{self.mlp_ratio}."
            )
        if not 0.0 <= self.drop_path_rate < 1.0:
            raise InputError(
                f"drop_path_rate is the probability of dropping a residual branch and must be in [0, 1), got "
                f"{self.drop_path_rate}."
            )
