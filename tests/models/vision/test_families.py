"""Every vision family against transformers' own classes: a checkpoint of every head upstream has loads
strictly into ours with equal outputs (every field, hidden states and attention weights included, 1e-5),
resizes its positions for other image sizes as upstream does, loads under other attention types with only
the type's own parameters new, and what we save with exact attention loads back into transformers' class
with equal outputs. Then what is a family's own: DeiT's two prefix tokens under window attention and its
classifier with a teacher, DINOv2's stochastic depth and mask token, the image processors of their
checkpoints.

The families and their heads: tests/models/vision/families.py.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors.torch import load_file
from transformers import AutoImageProcessor, AutoModelForImageClassification, Dinov2Config, Dinov2Model
from transformers.models.bit.image_processing_pil_bit import BitImageProcessorPil
from transformers.models.deit.image_processing_pil_deit import DeiTImageProcessorPil

import hf_efficient
from hf_efficient import (
    EfficientDeiTConfig,
    EfficientDeiTForImageClassification,
    EfficientDeiTForImageClassificationWithTeacher,
    EfficientDeiTModel,
    EfficientDinov2Config,
    EfficientDinov2Model,
    EfficientViTConfig,
    EfficientViTImageProcessor,
)
from hf_efficient.errors import InputError

from ..helpers import CONFIG_ERRORS
from .families import HEAD_CASES, TINY, VISION_FAMILIES, VisionFamily, randomise

CLOSE = dict(atol=1e-5, rtol=1e-5)
OTHER_SIZE = (24, 20)  # a 6x5 grid: positions resized, and not square


def case_id(case) -> str:
    family, upstream = case
    return f"{family.name}-{upstream.__name__}"


def upstream_checkpoint(family: VisionFamily, upstream: type, folder, **overrides) -> torch.nn.Module:
    """transformers' tiny ``upstream`` model (eager attention, which returns the weights), every parameter
    moved off its initial value, saved in ``folder``."""
    torch.manual_seed(0)
    model = upstream(family.config(upstream, **overrides)).eval()
    model.set_attn_implementation("eager")
    randomise(model)
    model.save_pretrained(folder)
    return model


def forward(model, inputs, **flags):
    with torch.no_grad():
        return model.eval()(**inputs, **flags)


def assert_same_outputs(got, expected) -> None:
    """The same fields as transformers', each equal: tensors, and the tuples of hidden states / weights."""
    assert set(got.keys()) == set(expected.keys())
    for name, theirs in expected.items():
        ours = got[name]
        if isinstance(theirs, tuple):
            assert len(ours) == len(theirs), name
            for index, (mine, other) in enumerate(zip(ours, theirs, strict=True)):
                torch.testing.assert_close(mine, other, **CLOSE, msg=f"{name}[{index}]")
        else:
            torch.testing.assert_close(ours, theirs, **CLOSE, msg=name)


def assert_loads_strictly(info) -> None:
    assert not any(info[key] for key in ("missing_keys", "unexpected_keys", "mismatched_keys")), info


@pytest.mark.parametrize("case", HEAD_CASES, ids=case_id)
def test_upstream_checkpoint_loads_strictly_with_equal_outputs(case, tmp_path):
    family, upstream = case
    reference = upstream_checkpoint(family, upstream, tmp_path)
    ours, info = family.ours(upstream).from_pretrained(tmp_path, output_loading_info=True)
    assert_loads_strictly(info)
    assert (
        ours.config.attention_type == "full"
        and type(ours.config).num_prefix_tokens == family.num_prefix_tokens
    )
    inputs, flags = family.inputs(upstream), dict(output_hidden_states=True, output_attentions=True)
    expected, got = forward(reference, inputs, **flags), forward(ours, inputs, **flags)
    assert expected.hidden_states[0].shape[1] == family.num_prefix_tokens + 16
    assert_same_outputs(got, expected)


@pytest.mark.parametrize(
    "case",
    [case for case in HEAD_CASES if case[0].task(case[1]) != "AutoModelForMaskedImageModeling"],
    ids=case_id,
)
def test_other_image_sizes_resize_positions_as_transformers(case, tmp_path):
    """A 24x20 image (a 6x5 grid): the prefix rows of the position table stay, the patch rows are resized
    bicubically (DINOv2's in float32, and without being asked); ViT and DeiT refuse it unless asked."""
    family, upstream = case
    reference = upstream_checkpoint(family, upstream, tmp_path)
    ours = family.ours(upstream).from_pretrained(tmp_path)
    inputs = family.inputs(upstream, labels=False, size=OTHER_SIZE)
    asked = {} if family.always_interpolates else {"interpolate_pos_encoding": True}
    assert_same_outputs(forward(ours, inputs, **asked), forward(reference, inputs, **asked))
    if family.always_interpolates:
        assert_same_outputs(forward(ours, inputs, interpolate_pos_encoding=True), forward(reference, inputs))
    else:
        with pytest.raises(ValueError, match="interpolate_pos_encoding=True"):
            forward(ours, inputs)


@pytest.mark.parametrize("case", HEAD_CASES, ids=case_id)
def test_saved_with_exact_attention_loads_back_into_transformers(case, tmp_path):
    family, upstream = case
    upstream_checkpoint(family, upstream, tmp_path / "upstream")
    ours = family.ours(upstream).from_pretrained(tmp_path / "upstream")
    ours.save_pretrained(tmp_path / "ours")
    back, info = upstream.from_pretrained(tmp_path / "ours", output_loading_info=True)
    assert_loads_strictly(info)
    inputs = family.inputs(upstream)
    assert_same_outputs(forward(ours, inputs), forward(back, inputs))


ATTENTION_CONFIGS = {"swin_window": {"window_size": 2}, "performer": {"num_features": 16}}


@pytest.mark.parametrize("attention_type", list(ATTENTION_CONFIGS))
@pytest.mark.parametrize("name", list(VISION_FAMILIES))
def test_every_head_loads_with_another_attention(name, attention_type, tmp_path):
    """Every weight of every head's checkpoint loads under another type (swin_window: 2x2 windows on the 4x4
    grid, shifted on layer 1); only the core's own parameters are new; each head trains (a finite loss or
    logits, finite gradients)."""
    family = VISION_FAMILIES[name]
    for index, upstream in enumerate(family.heads):
        folder = tmp_path / str(index)
        upstream_checkpoint(family, upstream, folder)
        config = ATTENTION_CONFIGS[attention_type]
        ours, info = family.ours(upstream).from_pretrained(
            folder, attention_type=attention_type, attention_config=config, output_loading_info=True
        )
        assert all(".core." in key for key in info["missing_keys"]), info["missing_keys"]
        assert not info["unexpected_keys"] and not info["mismatched_keys"], info
        theirs = load_file(folder / "model.safetensors")  # under the checkpoint's names
        for param_name, param in ours.named_parameters():
            if ".core." not in param_name:
                torch.testing.assert_close(param, theirs[param_name], atol=0, rtol=0, msg=param_name)
        out = ours.train()(**family.inputs(upstream))
        loss = out.loss if out.get("loss") is not None else out[0].square().mean()
        assert torch.isfinite(loss)
        loss.backward()
        assert all(p.grad is None or torch.isfinite(p.grad).all() for p in ours.parameters())


@pytest.mark.parametrize("size", [(16, 16), OTHER_SIZE])
@pytest.mark.parametrize("name", list(VISION_FAMILIES))
def test_window_attention_keeps_every_prefix_token_global(name, size, tmp_path):
    """swin_window is told the grid and the prefix tokens ([CLS]; DeiT's distillation token too) of every
    image size; one window covering the grid is exact attention, so with the checkpoint's weights it equals
    the exact model: the prefix tokens attend to and are attended by every patch."""
    family = VISION_FAMILIES[name]
    upstream = next(iter(family.heads))  # the bare model
    upstream_checkpoint(family, upstream, tmp_path)
    exact = family.ours(upstream).from_pretrained(tmp_path)
    window = family.ours(upstream).from_pretrained(
        tmp_path, attention_type="swin_window", attention_config={"window_size": 6}
    )
    seen = []
    window.encoder.layer[1].attention.attention.core.register_forward_pre_hook(
        lambda core, args: seen.append((args[3].grid_size, args[3].num_prefix_tokens))
    )
    inputs = family.inputs(upstream, size=size)
    asked = {"interpolate_pos_encoding": True} if size != (16, 16) else {}
    got, expected = forward(window, inputs, **asked), forward(exact, inputs, **asked)
    assert seen == [((size[0] // 4, size[1] // 4), family.num_prefix_tokens)]
    torch.testing.assert_close(got.last_hidden_state, expected.last_hidden_state, **CLOSE)


def test_dinov2_drop_path_in_training_matches_transformers(tmp_path):
    """Stochastic depth (drop_path_rate): in training each example's residual branches are dropped as
    transformers draws them (the same seed gives the same outputs), eval mode drops nothing."""
    family = VISION_FAMILIES["dinov2"]
    reference = upstream_checkpoint(family, Dinov2Model, tmp_path, drop_path_rate=0.5)
    ours = EfficientDinov2Model.from_pretrained(tmp_path)
    x = family.inputs(Dinov2Model)["pixel_values"]
    reference.train(), ours.train()
    outputs = []
    for model in (reference, ours, ours):
        torch.manual_seed(3)
        with torch.no_grad():
            outputs.append(model(x).last_hidden_state)
    torch.testing.assert_close(outputs[1], outputs[0], **CLOSE)
    torch.manual_seed(4)
    with torch.no_grad():
        assert not torch.allclose(ours(x).last_hidden_state, outputs[1])  # another draw
    torch.testing.assert_close(
        forward(ours, {"pixel_values": x}).last_hidden_state,
        forward(reference, {"pixel_values": x}).last_hidden_state,
        **CLOSE,
    )


def test_dinov2_mask_token_replaces_masked_patches_as_transformers(tmp_path):
    """DINOv2's bare model has a (1, D) mask token (``use_mask_token``, its default) for bool_masked_pos;
    without one, bool_masked_pos is refused naming the option."""
    family = VISION_FAMILIES["dinov2"]
    reference = upstream_checkpoint(family, Dinov2Model, tmp_path)
    ours = EfficientDinov2Model.from_pretrained(tmp_path)
    assert ours.embeddings.mask_token.shape == (1, 32)
    inputs = family.inputs(Dinov2Model)
    inputs["bool_masked_pos"] = torch.rand(3, 16, generator=torch.Generator().manual_seed(2)) < 0.5
    assert_same_outputs(forward(ours, inputs), forward(reference, inputs))
    unmasked = forward(ours, {"pixel_values": inputs["pixel_values"]})
    assert not torch.allclose(unmasked.last_hidden_state, forward(ours, inputs).last_hidden_state)
    without = EfficientDinov2Model(EfficientDinov2Config(**TINY, use_mask_token=False))
    assert without.embeddings.mask_token is None
    with pytest.raises(InputError, match="mask token.*use_mask_token=True"):
        forward(without, inputs)


def test_deit_with_teacher_is_chosen_by_architectures_and_refuses_labels(tmp_path):
    """AutoModelForImageClassification gives the classifier with a teacher for checkpoints saved from it (as
    transformers' tuple entry does), the plain one otherwise; the teacher's head is inference only."""
    config = EfficientDeiTConfig(**TINY, intermediate_size=37, num_labels=3)
    for model_class in (EfficientDeiTForImageClassificationWithTeacher, EfficientDeiTForImageClassification):
        model_class(config).save_pretrained(tmp_path / model_class.__name__)
        loaded = AutoModelForImageClassification.from_pretrained(tmp_path / model_class.__name__)
        assert type(loaded) is model_class
    teacher = EfficientDeiTForImageClassificationWithTeacher(config).eval()
    out = teacher(torch.randn(2, 3, 16, 16))
    torch.testing.assert_close(out.logits, (out.cls_logits + out.distillation_logits) / 2)
    with pytest.raises(InputError, match="inference only.*EfficientDeiTForImageClassification"):
        teacher(torch.randn(2, 3, 16, 16), labels=torch.tensor([0, 1]))


def test_the_attention_map_of_a_deit_patch_counts_both_prefix_tokens():
    """plot_patch_attention's map: patch 5's row of the last layer's weights (averaged over heads) after
    the two prefix tokens, and their weight beside it; the row sums to 1."""
    from hf_efficient.visualization import patch_attention_map

    model = EfficientDeiTModel(EfficientDeiTConfig(**TINY, intermediate_size=37)).eval()
    x = torch.randn(1, 3, 16, 16, generator=torch.Generator().manual_seed(0))
    grid, prefix = patch_attention_map(model, x, patch=5)
    row = forward(model, {"pixel_values": x}, output_attentions=True).attentions[-1][0, :, 2 + 5].mean(0)
    torch.testing.assert_close(grid, row[2:].reshape(4, 4))
    assert prefix == pytest.approx(float(row[:2].sum())) and float(grid.sum()) + prefix == pytest.approx(1.0)


def test_a_checkpoint_of_another_family_is_refused_naming_its_classes(tmp_path):
    EfficientDeiTConfig(**TINY).save_pretrained(tmp_path / "deit")
    Dinov2Config(**TINY).save_pretrained(tmp_path / "dinov2")
    with pytest.raises(InputError, match="model_type 'efficient_deit'.*EfficientDeiTModel"):
        EfficientViTConfig.from_pretrained(tmp_path / "deit")
    with pytest.raises(InputError, match="model_type 'dinov2'.*EfficientDinov2Model"):
        EfficientDeiTConfig.from_pretrained(tmp_path / "dinov2")


@pytest.mark.parametrize(
    "config_class, fields, message",
    [
        (EfficientDinov2Config, dict(drop_path_rate=1.0), r"drop_path_rate .* \[0, 1\), got 1.0"),
        (EfficientDinov2Config, dict(mlp_ratio=0), r"mlp_ratio must be > 0"),
        (EfficientDinov2Config, dict(image_size=[16, 12]), r"Field 'image_size' expected int"),
        (EfficientDeiTConfig, dict(image_size=18), r"image_size=18 must be a multiple of patch_size=4"),
        (EfficientDeiTConfig, dict(attention_type="graph_sparse"), r"graph_sparse"),
    ],
)
def test_bad_config_fields_raise_naming_them(config_class, fields, message):
    with pytest.raises(CONFIG_ERRORS, match=message):
        config_class(**{**TINY, **fields})


# ---------------------------------------------------------------------------------------------------------
# Image processors
# ---------------------------------------------------------------------------------------------------------

# The preprocessor_config.json files of the published checkpoints (facebook/deit-base-distilled-patch16-224:
# the old feature-extractor format, sizes as ints; facebook/dinov2-base: BiT's processor).
DEIT_PREPROCESSOR = {
    "crop_size": 224, "do_center_crop": True, "do_normalize": True, "do_resize": True,
    "feature_extractor_type": "DeiTFeatureExtractor", "image_mean": [0.485, 0.456, 0.406],
    "image_std": [0.229, 0.224, 0.225], "resample": 3, "size": 256,
}  # fmt: skip
DINOV2_PREPROCESSOR = {
    "crop_size": {"height": 224, "width": 224}, "do_center_crop": True, "do_convert_rgb": True,
    "do_normalize": True, "do_rescale": True, "do_resize": True, "image_mean": [0.485, 0.456, 0.406],
    "image_processor_type": "BitImageProcessor", "image_std": [0.229, 0.224, 0.225], "resample": 3,
    "rescale_factor": 0.00392156862745098, "size": {"shortest_edge": 256},
}  # fmt: skip


def photos() -> list[Image.Image]:
    rng = np.random.default_rng(0)
    return [
        Image.fromarray(rng.integers(0, 255, (300, 400, 3), dtype=np.uint8)),  # landscape
        Image.fromarray(rng.integers(0, 255, (260, 230, 3), dtype=np.uint8)),  # portrait
    ]


@pytest.mark.parametrize(
    "preprocessor, theirs",
    [(DEIT_PREPROCESSOR, DeiTImageProcessorPil), (DINOV2_PREPROCESSOR, BitImageProcessorPil)],
)
def test_the_checkpoints_preprocessor_configs_give_transformers_pixels(preprocessor, theirs, tmp_path):
    """DeiT's resize to 256 then center crop 224, DINOv2's shortest edge to 256 then center crop 224, both
    bicubic with ImageNet statistics: the same pixels as transformers' own processors of those families."""
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(preprocessor))
    ours, reference = EfficientViTImageProcessor.from_pretrained(tmp_path), theirs.from_pretrained(tmp_path)
    got, expected = (p(photos(), return_tensors="np").pixel_values for p in (ours, reference))
    assert got.shape == (2, 3, 224, 224)
    np.testing.assert_allclose(got, expected, atol=1e-6)
    grey = ours(photos()[0].convert("L"), return_tensors="np").pixel_values  # converted, as RGB photos
    assert grey.shape == (1, 3, 224, 224)


@pytest.mark.parametrize("name", ["deit", "dinov2"])
def test_auto_image_processor_and_family_defaults(name, tmp_path):
    """The new configs get our processor from AutoImageProcessor; for_config gives the family's
    preprocessing at the model's size (resize to 256/224 of it, center crop, ImageNet statistics)."""
    config = {"deit": EfficientDeiTConfig, "dinov2": EfficientDinov2Config}[name](**TINY)
    processor = EfficientViTImageProcessor.for_config(config)
    assert processor.do_center_crop and (processor.crop_size.height, processor.crop_size.width) == (16, 16)
    assert list(processor.image_mean) == [0.485, 0.456, 0.406]
    assert processor(photos(), return_tensors="pt").pixel_values.shape == (2, 3, 16, 16)
    config.save_pretrained(tmp_path)
    processor.save_pretrained(tmp_path)
    assert type(AutoImageProcessor.from_pretrained(tmp_path)) is EfficientViTImageProcessor
    assert (
        hf_efficient.models.families.FAMILIES[config.model_type].image_processor is EfficientViTImageProcessor
    )


def test_scripts_keep_a_crop_to_the_model_size_and_resize_others(tmp_path):
    """image_processor_for (the vision scripts'): a checkpoint's processor that center-crops to the model's
    image size keeps its resize and crop; one that crops to another size resizes to the model's instead."""
    from hf_efficient.data import image_processor_for

    (tmp_path / "preprocessor_config.json").write_text(json.dumps(DINOV2_PREPROCESSOR))
    kept = image_processor_for(EfficientDinov2Config(image_size=224), processor_name=str(tmp_path))
    assert kept.do_center_crop and kept.size.shortest_edge == 256
    small = image_processor_for(EfficientDinov2Config(**TINY), processor_name=str(tmp_path))
    assert not small.do_center_crop
    assert small(photos(), return_tensors="pt").pixel_values.shape == (2, 3, 16, 16)
