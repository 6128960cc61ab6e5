"""EfficientViT: parity with transformers' ViT / ViT-MAE, every vision attention type (checks.py), save/load,
Auto classes, pipeline on PIL images, errors. Tiny models only (hidden 32, 2 layers, 16x16 images, 4x4
patches: helpers.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image
from transformers import (
    AutoImageProcessor,
    AutoModelForPreTraining,
    ViTConfig,
    ViTForImageClassification,
    ViTMAEConfig,
    ViTMAEForPreTraining,
    ViTModel,
    pipeline,
)

import hf_efficient
from hf_efficient import (
    EfficientViTConfig,
    EfficientViTForImageClassification,
    EfficientViTImageProcessor,
    EfficientViTMAEForPreTraining,
    EfficientViTModel,
)
from hf_efficient.models.vision.modeling_efficient_vit import sincos_position_table

from ..helpers import CONFIG_ERRORS
from . import checks
from .helpers import TINY_DECODER, TINY_VIT, images, mae_noise, tiny_config

VISION_TYPES = hf_efficient.list_attention_types("vision")


# ---------------------------------------------------------------------------------------------------------
# Parity with transformers (attention_type="full")
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("channels", [3, 1])
def test_parity_with_transformers_vit_model_and_classifier(channels, tmp_path):
    x = images(channels=channels)
    ref = ViTModel(ViTConfig(**TINY_VIT, num_channels=channels)).eval()
    ref.save_pretrained(tmp_path / "vit")
    ours = EfficientViTModel.from_pretrained(tmp_path / "vit").eval()
    with torch.no_grad():
        expected, got = ref(x), ours(x)
    torch.testing.assert_close(got.last_hidden_state, expected.last_hidden_state, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got.pooler_output, expected.pooler_output, atol=1e-5, rtol=1e-5)
    ref.set_attn_implementation("eager")  # transformers' sdpa kernel returns no weights
    with torch.no_grad():
        expected = ref(x, output_hidden_states=True, output_attentions=True)
        got = ours(x, output_hidden_states=True, output_attentions=True)
    for name in ("hidden_states", "attentions"):
        assert len(getattr(got, name)) == len(getattr(expected, name))
        for mine, theirs in zip(getattr(got, name), getattr(expected, name), strict=True):
            torch.testing.assert_close(mine, theirs, atol=1e-5, rtol=1e-5)

    ref = ViTForImageClassification(ViTConfig(**TINY_VIT, num_channels=channels, num_labels=3)).eval()
    ref.save_pretrained(tmp_path / "cls")
    ours, info = EfficientViTForImageClassification.from_pretrained(
        tmp_path / "cls", output_loading_info=True
    )
    assert not info["missing_keys"] and not info["unexpected_keys"]
    big = images(channels=channels, size=24)  # another size: bicubic position embeddings, as transformers
    with torch.no_grad():
        torch.testing.assert_close(ours.eval()(x).logits, ref(x).logits, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(
            ours(big, interpolate_pos_encoding=True).logits,
            ref(big, interpolate_pos_encoding=True).logits,
            atol=1e-5,
            rtol=1e-5,
        )
    # The same checkpoint with window attention: loads every ViT weight, runs.
    swin = EfficientViTForImageClassification.from_pretrained(
        tmp_path / "cls", attention_type="swin_window", attention_config={"window_size": 2}
    ).eval()
    assert swin.vit.encoder.layer[1].attention.attention.core.attention_type == "swin_window"
    torch.testing.assert_close(swin.classifier.weight, ours.classifier.weight)
    assert swin(x).logits.shape == (2, 3)


@pytest.mark.parametrize("norm_pix_loss", [False, True])
def test_parity_with_transformers_vit_mae(norm_pix_loss, tmp_path):
    ref = ViTMAEForPreTraining(ViTMAEConfig(**TINY_VIT, **TINY_DECODER, norm_pix_loss=norm_pix_loss)).eval()
    # transformers 5 writes the decoder layers as decoder.decoder_encoder.layer.N
    ref.save_pretrained(tmp_path)
    ours, info = EfficientViTMAEForPreTraining.from_pretrained(tmp_path, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    x, noise = images(), mae_noise()
    with torch.no_grad():
        expected, got = ref(x, noise=noise), ours.eval()(x, noise=noise)
    assert torch.equal(got.mask, expected.mask) and torch.equal(got.ids_restore, expected.ids_restore)
    torch.testing.assert_close(got.logits, expected.logits, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got.loss, expected.loss, atol=1e-5, rtol=1e-5)
    assert got.mask.sum(-1).tolist() == [12.0, 12.0]  # 75% of 16 patches masked

    # Our own save writes the published MAE layout (decoder.decoder_layers.N) and loads back identically.
    ours.save_pretrained(tmp_path / "ours")
    again = AutoModelForPreTraining.from_pretrained(tmp_path / "ours").eval()
    assert type(again) is EfficientViTMAEForPreTraining
    torch.testing.assert_close(again(x, noise=noise).logits, got.logits, atol=0, rtol=0)

    # Other attention types load the same checkpoint; window attention serves the decoder only.
    other = EfficientViTMAEForPreTraining.from_pretrained(tmp_path, attention_type="nystromformer").eval()
    assert torch.isfinite(other(x, noise=noise).loss)
    with pytest.raises(ValueError, match="random subset"):
        EfficientViTMAEForPreTraining.from_pretrained(tmp_path, attention_type="swin_window")
    mixed = EfficientViTMAEForPreTraining.from_pretrained(
        tmp_path, attention_type="swin_window", layer_attention_types=["full", "full"]
    ).eval()
    assert mixed.decoder.decoder_layers[0].attention.attention.core.attention_type == "swin_window"
    assert torch.isfinite(mixed(x, noise=noise).loss)


def test_mae_one_channel_other_size_and_unpatchify():
    model = EfficientViTMAEForPreTraining(tiny_config(num_channels=1, mask_ratio=0.5)).eval()
    x = images(channels=1, size=24)  # a 6x6 grid: sin-cos tables rebuilt for it
    out = model(x, interpolate_pos_encoding=True)
    assert out.logits.shape == (2, 36, 16) and out.mask.sum(-1).tolist() == [18.0, 18.0]
    torch.testing.assert_close(model.unpatchify(model.patchify(x), grid=(6, 6)), x)
    table = model.vit.embeddings.position_embeddings  # fixed: no gradient
    assert not table.requires_grad and not model.decoder.decoder_pos_embed.requires_grad
    with pytest.raises(ValueError, match="noise must have shape"):
        model(images(channels=1), noise=torch.rand(2, 5))


# ---------------------------------------------------------------------------------------------------------
# Every vision attention type
# ---------------------------------------------------------------------------------------------------------


def test_sincos_position_init_starts_learned_positions_from_the_table(tmp_path):
    table = sincos_position_table(4, 4, TINY_VIT["hidden_size"])  # (1, 1 + 16, 32), zero [CLS] row
    config = EfficientViTConfig(**TINY_VIT, position_embedding_init="sincos")
    model = EfficientViTForImageClassification(config)
    positions = model.vit.embeddings.position_embeddings
    torch.testing.assert_close(positions.data, table)
    assert positions.requires_grad, "sincos only sets the start: the positions stay learned"
    default = EfficientViTForImageClassification(EfficientViTConfig(**TINY_VIT))
    assert not torch.allclose(default.vit.embeddings.position_embeddings, table)
    with torch.no_grad():  # trained positions survive save/load (loading does not re-initialise them)
        positions.add_(0.5)
    model.save_pretrained(tmp_path)
    loaded = EfficientViTForImageClassification.from_pretrained(tmp_path)
    assert loaded.config.position_embedding_init == "sincos"
    torch.testing.assert_close(loaded.vit.embeddings.position_embeddings, positions)
    with pytest.raises(CONFIG_ERRORS, match="position_embedding_init"):
        EfficientViTConfig(**TINY_VIT, position_embedding_init="zeros")


def test_vision_types_exclude_graph_only_ones():
    assert "swin_window" in VISION_TYPES and "full" in VISION_TYPES and "graph_sparse" not in VISION_TYPES
    assert "swin_window" not in hf_efficient.list_attention_types("text")
    with pytest.raises(CONFIG_ERRORS, match="not available for vision"):
        EfficientViTConfig(**TINY_VIT, attention_type="graph_sparse")


@pytest.mark.parametrize("attention_type", VISION_TYPES)
def test_classification_and_mae_forward_backward(attention_type):
    checks.check_classification_and_mae_forward_backward(attention_type)


@pytest.mark.parametrize("attention_type", VISION_TYPES)
def test_save_load_identical_through_auto_classes(attention_type, tmp_path):
    checks.check_save_load_identical_through_auto_classes(attention_type, tmp_path)


@pytest.mark.parametrize("attention_type", VISION_TYPES)
def test_output_attentions_or_a_clear_error(attention_type):
    checks.check_output_attentions_or_a_clear_error(attention_type)


@pytest.mark.parametrize("attention_type", VISION_TYPES)
def test_gradient_checkpointing_same_gradients(attention_type):
    checks.check_gradient_checkpointing_same_gradients(attention_type)


def test_swin_window_follows_the_image_size():
    model = EfficientViTModel(tiny_config("swin_window")).eval()
    core = model.encoder.layer[1].attention.attention.core
    grids = []
    core.register_forward_pre_hook(
        lambda core, args: grids.append((args[3].grid_size, args[3].num_prefix_tokens))
    )
    model(images())
    out = model(images(size=24), interpolate_pos_encoding=True)
    assert out.last_hidden_state.shape == (2, 37, 32)
    assert grids == [((4, 4), 1), ((6, 6), 1)]
    # one window covering the grid is exact attention: equal to the full model with the same weights
    full = EfficientViTModel(tiny_config("full")).eval()
    wide = EfficientViTModel(tiny_config("swin_window", attention_config={"window_size": 4}))
    wide.load_state_dict(full.state_dict())
    torch.testing.assert_close(wide.eval()(images()).last_hidden_state, full(images()).last_hidden_state)


# ---------------------------------------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------------------------------------


def test_wrong_image_size_or_channels_raise():
    model = EfficientViTModel(tiny_config()).eval()
    with pytest.raises(ValueError, match="interpolate_pos_encoding=True"):
        model(images(size=24))
    with pytest.raises(ValueError, match="num_channels=3"):
        model(images(channels=1))
    with pytest.raises(ValueError, match="multiple of patch_size"):
        model(images(size=18), interpolate_pos_encoding=True)
    with pytest.raises(CONFIG_ERRORS, match="multiple of patch_size"):
        EfficientViTConfig(**{**TINY_VIT, "image_size": 18})
    with pytest.raises(CONFIG_ERRORS, match="qkv_bias"):
        EfficientViTConfig(**TINY_VIT, qkv_bias=False)


def test_checkpoint_of_another_architecture_raises(tmp_path):
    hf_efficient.EfficientBertConfig(hidden_size=32, num_attention_heads=4).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="cannot be mapped onto EfficientViTConfig"):
        EfficientViTConfig.from_pretrained(tmp_path)


# ---------------------------------------------------------------------------------------------------------
# Image processor and pipeline (no torchvision)
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("channels", [1, 3])
def test_image_classification_pipeline_on_pil_images(channels, tmp_path):
    labels = {0: "coat", 1: "shirt", 2: "bag"}
    config = tiny_config(
        num_channels=channels, num_labels=3, id2label=labels, label2id={v: k for k, v in labels.items()}
    )
    model = EfficientViTForImageClassification(config).eval()
    processor = EfficientViTImageProcessor.for_config(config)
    rng = np.random.default_rng(0)
    photos = [
        Image.fromarray(rng.integers(0, 255, (20, 28, 3), dtype=np.uint8)),  # RGB, another size
        Image.fromarray(rng.integers(0, 255, (16, 16), dtype=np.uint8)),  # grey
    ]
    assert processor(photos, return_tensors="pt").pixel_values.shape == (2, channels, 16, 16)
    classify = pipeline("image-classification", model=model, image_processor=processor)
    results = classify(photos, top_k=2)
    assert [len(r) for r in results] == [2, 2] and results[0][0]["label"] in labels.values()

    model.save_pretrained(tmp_path)
    processor.save_pretrained(tmp_path)
    reloaded = AutoImageProcessor.from_pretrained(tmp_path)
    assert type(reloaded) is EfficientViTImageProcessor and reloaded.num_channels == channels
    assert (
        pipeline("image-classification", model=str(tmp_path))(photos[0], top_k=1)[0]["label"]
        in labels.values()
    )


def test_attention_map_png(tmp_path):
    from hf_efficient.visualization import plot_patch_attention

    model = EfficientViTModel(tiny_config("swin_window")).eval()
    path = tmp_path / "plots" / "attention.png"  # a folder that does not exist yet is made
    assert plot_patch_attention(model, images(b=1), patch=(1, 2), layer=1, path=path) == path
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ValueError, match="output_attentions"):
        plot_patch_attention(
            EfficientViTModel(tiny_config("linear")), images(b=1), patch=0, path=tmp_path / "x.png"
        )
