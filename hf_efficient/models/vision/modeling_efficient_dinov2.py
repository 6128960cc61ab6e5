"""EfficientDinov2: DINOv2 (Oquab et al. 2023, self-supervised vision features) with any registered vision
attention; what differs from the shared vision encoder lives here.

DINOv2's layer is pre-LayerNorm like ViT's, with its own names and two additions: LayerScale (each residual
branch multiplied by a learned vector, ``layer_scale1.lambda1`` / ``layer_scale2.lambda1``) and stochastic
depth (a residual branch dropped per example in training, ``drop_path_rate``); its feed-forward is
``mlp.fc1`` / ``mlp.fc2``, or with ``use_swiglu_ffn`` (DINOv2-giant) the SwiGLU ``mlp.weights_in`` (the gate
and value halves in one matrix) / ``mlp.weights_out``. Its attention is ViT's module
(``attention.attention.query`` ..., ``attention.output.dense``), with no dropout after the projection. Its
position table always follows the image's patch grid (resized bicubically in float32, as transformers'
``Dinov2Embeddings``), and its pooled output is the final [CLS].

Shapes: b = batch, N = patches, D = hidden_size, F = the feed-forward's width (``config.mlp_hidden_size``).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F
from transformers import initialization as init
from transformers.activations import ACT2FN
from transformers.modeling_layers import GradientCheckpointingLayer

from ...attention.inputs import AttentionInputs
from ...modeling.blocks import EfficientPreNormAttention
from ...modeling.memory import memory_saving_feed_forward
from .configuration_efficient_dinov2 import EfficientDinov2Config
from .encoder import EfficientVisionEmbeddings, EfficientVisionModel, EfficientVisionPreTrainedModel
from .tasks import ImageClassificationTask, linear_classifier


class EfficientDinov2Embeddings(EfficientVisionEmbeddings):
    """[CLS] + patches + positions resized to every image's grid (no ``interpolate_pos_encoding`` needed),
    in float32: bicubic resampling in half precision shifts the positions (transformers' reason too).
    Its mask token is (1, D)."""

    always_interpolate = True
    mask_token_shape = (1,)

    def resize_positions(self, patch_rows: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
        return super().resize_positions(patch_rows.float(), grid).to(patch_rows.dtype)


class EfficientLayerScale(nn.Module):
    """x * lambda1, a learned per-channel scale of a residual branch (Touvron et al. 2021, CaiT)."""

    def __init__(self, config: EfficientDinov2Config):
        super().__init__()
        self.lambda1 = nn.Parameter(torch.full((config.hidden_size,), float(config.layerscale_value)))

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return hidden_states * self.lambda1


class EfficientDropPath(nn.Module):
    """Stochastic depth (Huang et al. 2016), as transformers' ``Dinov2DropPath``: in training each example's
    residual branch is dropped with probability ``p`` and the kept ones scaled by 1 / (1 - p); the identity
    in eval mode."""

    def __init__(self, p: float):
        super().__init__()
        self.p = p

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        if self.p == 0.0 or not self.training:
            return hidden_states
        keep = 1.0 - self.p
        shape = (hidden_states.shape[0],) + (1,) * (hidden_states.dim() - 1)  # one draw per example
        kept = torch.floor(torch.rand(shape, dtype=hidden_states.dtype, device=hidden_states.device) + keep)
        return hidden_states.div(keep) * kept

    def extra_repr(self) -> str:
        return f"p={self.p}"


class EfficientDinov2MLP(nn.Module):
    """DINOv2's feed-forward: ``fc1`` (D -> F), ``hidden_act``, ``fc2`` (F -> D)."""

    def __init__(self, config: EfficientDinov2Config):
        super().__init__()
        self.fc1 = nn.Linear(config.hidden_size, config.mlp_hidden_size)
        self.activation = ACT2FN[config.hidden_act]
        self.fc2 = nn.Linear(config.mlp_hidden_size, config.hidden_size)

    def parts(self) -> tuple[nn.Module, nn.Module, nn.Module]:
        """(first projection, activation, second projection)."""
        return self.fc1, self.activation, self.fc2


def swiglu(gate_and_value: torch.Tensor) -> torch.Tensor:
    """(..., 2F) -> (..., F): silu(gate) * value, the gate the first half (DINOv2's fused ``weights_in``)."""
    gate, value = gate_and_value.chunk(2, dim=-1)
    return F.silu(gate) * value


class EfficientDinov2SwiGLU(nn.Module):
    """DINOv2's SwiGLU feed-forward (``use_swiglu_ffn``): ``weights_in`` (D -> 2F, the gate and the value),
    silu(gate) * value, ``weights_out`` (F -> D)."""

    def __init__(self, config: EfficientDinov2Config):
        super().__init__()
        self.weights_in = nn.Linear(config.hidden_size, 2 * config.mlp_hidden_size)
        self.weights_out = nn.Linear(config.mlp_hidden_size, config.hidden_size)

    def parts(self) -> tuple[nn.Module, object, nn.Module]:
        return self.weights_in, swiglu, self.weights_out


class EfficientDinov2Layer(GradientCheckpointingLayer):
    """One DINOv2 layer: h = x + DropPath(LayerScale1(Attn(norm1(x)))), then
    h + DropPath(LayerScale2(MLP(norm2(h)))); the attention is ViT's module over one attention core."""

    def __init__(self, config: EfficientDinov2Config, layer_idx: int):
        super().__init__()
        self.norm1 = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.attention = EfficientPreNormAttention(config, layer_idx, output_dropout=0.0)
        self.layer_scale1 = EfficientLayerScale(config)
        self.drop_path = EfficientDropPath(config.drop_path_rate)
        self.norm2 = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.mlp = EfficientDinov2SwiGLU(config) if config.use_swiglu_ffn else EfficientDinov2MLP(config)
        self.layer_scale2 = EfficientLayerScale(config)

    def forward(
        self, hidden_states: torch.Tensor, inputs: AttentionInputs
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        attended, weights = self.attention(self.norm1(hidden_states), inputs)  # (b, n, D)
        hidden_states = self.drop_path(self.layer_scale1(attended)) + hidden_states
        first, activation, _ = self.mlp.parts()
        normed = self.norm2(hidden_states)
        output = memory_saving_feed_forward(self, first, activation, self.mlp_branch, normed, hidden_states)
        return output, weights

    def mlp_branch(self, activated: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """The feed-forward's end: (b, n, F) activations -> the second projection, LayerScale, DropPath and
        the residual."""
        second = self.mlp.parts()[-1]
        return self.drop_path(self.layer_scale2(second(activated))) + residual


class EfficientDinov2PreTrainedModel(EfficientVisionPreTrainedModel):
    config_class = EfficientDinov2Config
    base_model_prefix = "dinov2"
    _no_split_modules = ["EfficientDinov2Layer"]

    @torch.no_grad()
    def _init_weights(self, module):
        """DINOv2's init: truncated normal projections, zero biases, LayerScale at ``layerscale_value``."""
        super()._init_weights(module)
        if isinstance(module, (nn.Linear, nn.Conv2d)):
            init.trunc_normal_(module.weight, mean=0.0, std=self.config.initializer_range)
            if module.bias is not None:
                init.zeros_(module.bias)
        elif isinstance(module, EfficientLayerScale):
            init.constant_(module.lambda1, self.config.layerscale_value)


class EfficientDinov2Model(EfficientDinov2PreTrainedModel, EfficientVisionModel):
    """The bare encoder (transformers' ``Dinov2Model``): final-LayerNorm hidden states (b, 1 + N, D) and the
    pooled output, the final [CLS] (b, D). A mask token when ``config.use_mask_token`` (DINOv2's default)."""

    embeddings_class = EfficientDinov2Embeddings
    layer_class = EfficientDinov2Layer
    pooler_class = None

    def __init__(self, config: EfficientDinov2Config):
        super().__init__(config, use_mask_token=config.use_mask_token)

    def pool(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return hidden_states[:, 0]  # (b, 1 + N, D) -> (b, D): the final-LayerNorm [CLS]


class EfficientDinov2ForImageClassification(EfficientDinov2PreTrainedModel, ImageClassificationTask):
    """A linear classifier on the final [CLS] beside the mean of the final patch tokens (b, 2D), as
    transformers' ``Dinov2ForImageClassification`` (DINOv2's linear evaluation)."""

    bare_model_class = EfficientDinov2Model
    bare_model_options = {}

    def build_head(self, config) -> None:
        self.num_labels = config.num_labels
        self.classifier = linear_classifier(2 * config.hidden_size, config.num_labels)

    def image_features(self, outputs) -> torch.Tensor:
        hidden = outputs.last_hidden_state  # (b, 1 + N, D)
        return torch.cat([hidden[:, 0], hidden[:, 1:].mean(dim=1)], dim=1)  # (b, 2D)
