"""What every vision attention type must do inside EfficientViT and its MAE, as plain checks on a type's
name: classification and MAE forward/backward, save/load through the Auto classes, attention weights or a
clear error, gradient checkpointing.

tests/models/vision/test_modeling.py parametrises them over ``list_attention_types("vision")``; a test that
registers a mechanism of its own runs them all with :func:`check_vision_encoder`.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
import torch
from transformers import AutoConfig, AutoModel, AutoModelForImageClassification

from hf_efficient import (
    EfficientViTConfig,
    EfficientViTForImageClassification,
    EfficientViTMAEForPreTraining,
    EfficientViTModel,
    get_attention_class,
)

from ..helpers import (
    assert_grads_finite,
    assert_same_gradients,
    check_export_matches,
    enable_gradient_checkpointing,
    parameter_gradients,
)
from .helpers import images, mae_noise, tiny_config


def check_classification_and_mae_forward_backward(attention_type: str) -> None:
    model = EfficientViTForImageClassification(tiny_config(attention_type, num_labels=3)).train()
    out = model(images(), labels=torch.tensor([0, 2]), output_hidden_states=True)
    assert out.logits.shape == (2, 3) and len(out.hidden_states) == 3
    assert out.hidden_states[0].shape == (2, 17, 32)
    out.loss.backward()
    assert_grads_finite(model)

    encoder_types = ["full", "full"] if get_attention_class(attention_type).capabilities.patch_grid else None
    mae = EfficientViTMAEForPreTraining(
        tiny_config(attention_type, layer_attention_types=encoder_types)
    ).train()
    out = mae(images(), noise=mae_noise())
    assert out.logits.shape == (2, 16, 48) and torch.isfinite(out.loss)
    out.loss.backward()
    assert mae.vit.embeddings.patch_embeddings.projection.weight.grad.abs().sum() > 0


def check_save_load_identical_through_auto_classes(attention_type: str, folder: Path) -> None:
    x = images()
    for model_class, auto_class, field in [
        (EfficientViTForImageClassification, AutoModelForImageClassification, "logits"),
        (EfficientViTModel, AutoModel, "pooler_output"),
    ]:
        model = model_class(tiny_config(attention_type, num_labels=3)).eval()
        model_folder = folder / model_class.__name__
        model.save_pretrained(model_folder)
        config = AutoConfig.from_pretrained(model_folder)
        assert type(config) is EfficientViTConfig and config.attention_type == attention_type
        loaded = auto_class.from_pretrained(model_folder).eval()
        assert type(loaded) is model_class
        with torch.no_grad():
            torch.testing.assert_close(getattr(loaded(x), field), getattr(model(x), field), atol=0, rtol=0)
    # A classifier checkpoint also opens as the bare encoder.
    base = AutoModel.from_pretrained(folder / "EfficientViTForImageClassification").eval()
    assert type(base) is EfficientViTModel


def check_output_attentions_or_a_clear_error(attention_type: str) -> None:
    model = EfficientViTModel(tiny_config(attention_type)).eval()
    if not get_attention_class(attention_type).capabilities.output_attentions:
        with pytest.raises(ValueError, match="output_attentions=False"):
            model(images(), output_attentions=True)
        return
    attentions = model(images(), output_attentions=True).attentions
    assert len(attentions) == 2 and attentions[0].shape == (2, 4, 17, 17)
    torch.testing.assert_close(attentions[0].sum(-1), torch.ones(2, 4, 17))


def check_gradient_checkpointing_same_gradients(attention_type: str) -> None:
    model = EfficientViTForImageClassification(tiny_config(attention_type, num_labels=3)).train()
    x, labels = images(), torch.tensor([1, 2])

    def loss():
        return model(x, labels=labels).loss

    plain = parameter_gradients(model, loss)
    enable_gradient_checkpointing(model)
    assert all(layer.gradient_checkpointing for layer in model.vit.encoder.layer)
    assert_same_gradients(parameter_gradients(model, loss), plain)


def check_exports(attention_type: str, folder: Path) -> None:
    """An image classifier exports (torch.export and ONNX) and matches the model at unseen batch sizes (the
    sequence is the model's patch grid)."""
    model = EfficientViTForImageClassification(tiny_config(attention_type, num_labels=3))
    check_export_matches(model, folder)


def check_vision_encoder(attention_type: str, folder: Path | None = None) -> None:
    """Every check above on ``attention_type``; ``folder``: where checkpoints go (a temporary one if None)."""
    if folder is None:
        with tempfile.TemporaryDirectory() as tmp:
            return check_vision_encoder(attention_type, Path(tmp))
    check_classification_and_mae_forward_backward(attention_type)
    check_save_load_identical_through_auto_classes(attention_type, Path(folder))
    check_output_attentions_or_a_clear_error(attention_type)
    check_gradient_checkpointing_same_gradients(attention_type)
