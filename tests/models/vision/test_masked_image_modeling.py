"""EfficientViTForMaskedImageModeling (transformers' ViTForMaskedImageModeling): parity, its checkpoints under
other attention types, the mask token, the loss, bad masks, the Auto class.

Tiny models (helpers.py: 16x16 images, 4x4 patches, a 4x4 grid), with encoder_stride = patch_size so the
reconstruction has the image's size.
"""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForMaskedImageModeling, ViTConfig, ViTForMaskedImageModeling

from hf_efficient import EfficientViTForMaskedImageModeling, EfficientViTModel
from hf_efficient.errors import InputError

from ..helpers import assert_grads_finite, check_export_matches
from .helpers import TINY_VIT, attention_config, images, tiny_config

STRIDE = dict(encoder_stride=TINY_VIT["patch_size"])


def masked_patches(b: int = 2, n: int = 16, seed: int = 3) -> torch.Tensor:
    """(b, n) bool: about half the patches masked, at least one in each image."""
    masked = torch.rand(b, n, generator=torch.Generator().manual_seed(seed)) < 0.5
    masked[:, 0] = True
    return masked


def upstream_checkpoint(folder, channels: int = 3) -> ViTForMaskedImageModeling:
    """A saved ViTForMaskedImageModeling whose mask token and decoder bias are not their zero init, so a
    weight that fails to load shows."""
    ref = ViTForMaskedImageModeling(ViTConfig(**TINY_VIT, **STRIDE, num_channels=channels)).eval()
    with torch.no_grad():
        ref.vit.embeddings.mask_token.normal_()
        ref.decoder[0].bias.normal_()
    ref.save_pretrained(folder)
    return ref


@pytest.mark.parametrize("channels", [3, 1])
def test_parity_with_transformers_masked_image_modeling(channels, tmp_path):
    """transformers' checkpoint loads whole; with full attention the reconstruction and the L1 loss over
    the masked pixels equal transformers' to 1e-5, with a mask, without one (no loss), and at another image
    size (positions interpolated)."""
    ref = upstream_checkpoint(tmp_path, channels)
    ours, info = EfficientViTForMaskedImageModeling.from_pretrained(tmp_path, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    ours.eval()
    x, masked = images(channels=channels), masked_patches()
    close = dict(atol=1e-5, rtol=1e-5)
    with torch.no_grad():
        expected, got = ref(x, bool_masked_pos=masked), ours(x, bool_masked_pos=masked)
        assert got.reconstruction.shape == x.shape
        torch.testing.assert_close(got.reconstruction, expected.reconstruction, **close)
        torch.testing.assert_close(got.loss, expected.loss, **close)
        unmasked = ours(x)
        assert unmasked.loss is None
        torch.testing.assert_close(unmasked.reconstruction, ref(x).reconstruction, **close)
        big = images(channels=channels, size=24)
        torch.testing.assert_close(
            ours(big, interpolate_pos_encoding=True).reconstruction,
            ref(big, interpolate_pos_encoding=True).reconstruction,
            **close,
        )


@pytest.mark.parametrize("attention_type", ["linformer", "swin_window", "performer"])
def test_checkpoint_loads_with_another_attention_and_trains(attention_type, tmp_path):
    """Only the attention's own parameters are new; the loss has a gradient for every parameter, the mask
    token included."""
    upstream_checkpoint(tmp_path)
    ours, info = EfficientViTForMaskedImageModeling.from_pretrained(
        tmp_path,
        attention_type=attention_type,
        attention_config=attention_config(attention_type),
        output_loading_info=True,
    )
    assert all(".attention.attention.core." in key for key in info["missing_keys"]), info["missing_keys"]
    assert not info["unexpected_keys"] and not info["mismatched_keys"], info
    saved = load_file(tmp_path / "model.safetensors")  # ViT's names (transformers 5 renames its modules)
    for name, param in ours.named_parameters():
        if ".core." not in name:
            torch.testing.assert_close(param, saved[name], atol=0, rtol=0, msg=name)
    out = ours.train()(images(), bool_masked_pos=masked_patches())
    assert out.reconstruction.shape == (2, 3, 16, 16) and torch.isfinite(out.loss)
    out.loss.backward()
    assert_grads_finite(ours)
    assert ours.vit.embeddings.mask_token.grad.abs().sum() > 0


def test_masked_patches_are_hidden_and_the_loss_counts_them_only():
    """The pixels of a masked patch reach nothing (the mask token stands in for them), and the loss is the
    mean absolute error over the masked patches' pixels and channels."""
    model = EfficientViTForMaskedImageModeling(tiny_config("full", **STRIDE)).eval()
    x, masked = images(), masked_patches()
    other = x.clone()
    other[:, :, :4, :4] = torch.randn(2, 3, 4, 4)  # patch 0, masked in both images
    with torch.no_grad():
        out = model(x, bool_masked_pos=masked)
        torch.testing.assert_close(model(other, bool_masked_pos=masked).reconstruction, out.reconstruction)
        assert not torch.allclose(model(x).reconstruction, out.reconstruction)  # unmasked, patch 0 is seen
    pixel_mask = masked.reshape(2, 1, 4, 1, 4, 1).expand(2, 3, 4, 4, 4, 4).reshape(2, 3, 16, 16)
    expected = (out.reconstruction - x).abs()[pixel_mask].mean()
    torch.testing.assert_close(
        out.loss, expected, atol=1e-6, rtol=1e-4
    )  # transformers' 1e-5 in the denominator


BAD_MASKS = [
    (
        torch.ones(2, 15, dtype=torch.bool),
        r"bool_masked_pos must have shape \(batch, num_patches\) = \(2, 16\)",
    ),
    (torch.ones(2, 16), r"bool_masked_pos must be a bool \(or 0/1 integer\) tensor, got torch.float32"),
    (torch.full((2, 16), 2), r"bool_masked_pos holds values in \[2, 2\]; it must hold only 0 and 1"),
]


@pytest.mark.parametrize("bad, message", BAD_MASKS)
def test_bad_bool_masked_pos_raises_naming_it(bad, message):
    model = EfficientViTForMaskedImageModeling(tiny_config("full", **STRIDE)).eval()
    with pytest.raises(ValueError, match=message):
        model(images(), bool_masked_pos=bad)


def test_mask_without_mask_token_or_with_another_stride_raises():
    with pytest.raises(InputError, match="bool_masked_pos replaces patches by a mask token.*use_mask_token"):
        EfficientViTModel(tiny_config()).eval()(images(), bool_masked_pos=masked_patches())
    model = EfficientViTForMaskedImageModeling(tiny_config(encoder_stride=2)).eval()
    assert model(images()).reconstruction.shape == (2, 3, 8, 8)  # no mask: any stride, as transformers
    with pytest.raises(InputError, match="encoder_stride=2 .* patch_size=4 .* encoder_stride equal to"):
        model(images(), bool_masked_pos=masked_patches())


def test_save_load_identical_through_the_auto_class(tmp_path):
    model = EfficientViTForMaskedImageModeling(tiny_config("swin_window", **STRIDE)).eval()
    with torch.no_grad():
        model.vit.embeddings.mask_token.normal_()  # a trained mask token must survive loading
        expected = model(images(), bool_masked_pos=masked_patches())
    model.save_pretrained(tmp_path)
    loaded = AutoModelForMaskedImageModeling.from_pretrained(tmp_path).eval()
    assert type(loaded) is EfficientViTForMaskedImageModeling and loaded.config.encoder_stride == 4
    with torch.no_grad():
        got = loaded(images(), bool_masked_pos=masked_patches())
    torch.testing.assert_close(got.reconstruction, expected.reconstruction, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(got.loss, expected.loss, atol=1e-6, rtol=1e-6)


@pytest.mark.slow  # torch.export and ONNX Runtime
def test_exports_and_matches_at_unseen_batch_sizes(tmp_path):
    """The reconstruction of the exported program and of ONNX Runtime match the eager model (batch 1 and 3,
    traced at 2). The head's decoder is what this exports: around full attention and one layer (swin_window's
    export, shifted windows included, is tests/test_export.py::test_every_type_exports_and_matches
    [vision-swin_window])."""
    model = EfficientViTForMaskedImageModeling(tiny_config("full", num_hidden_layers=1, **STRIDE))
    check_export_matches(model, tmp_path)
