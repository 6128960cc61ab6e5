"""Config fields of the wrong type or value raise naming the field, the value and what it must be: on
construction, on assignment, and in ``from_pretrained`` of an edited config.json (which then also names the
folder), for the text, vision and graph configs.

The configs are ``@strict`` dataclasses; their modules keep real annotations (no ``from __future__ import
annotations``, which turns them into strings that ``@strict`` silently skips), so every field's type is
checked, and class validators check the values.
"""

from __future__ import annotations

import json

import pytest
from transformers import AutoConfig

from hf_efficient import EfficientBertConfig, EfficientBertModel, EfficientGraphConfig, EfficientViTConfig

from .helpers import CONFIG_ERRORS
from .text.helpers import TINY_BERT

CONSTRUCTION_CASES = {
    "a string where an int belongs": (
        EfficientBertConfig,
        dict(hidden_size="32"),
        r"Field 'hidden_size' expected int, got str \(value: '32'\)",
    ),
    "a float layer count": (
        EfficientBertConfig,
        dict(num_hidden_layers=2.0),
        r"Field 'num_hidden_layers' expected int, got float \(value: 2.0\)",
    ),
    "a bool size": (
        EfficientBertConfig,
        dict(hidden_size=True),
        r"Field 'hidden_size' expected int, got bool",
    ),
    "attention_config as a JSON string": (
        EfficientBertConfig,
        dict(attention_config='{"attention_window": 4}'),
        r"Field 'attention_config' expected dict, got str",
    ),
    "attention_config as a list": (
        EfficientBertConfig,
        dict(attention_config=[4]),
        r"Field 'attention_config' expected dict, got list",
    ),
    "layer_attention_types as a string": (
        EfficientBertConfig,
        dict(num_hidden_layers=2, layer_attention_types="full"),
        r"Field 'layer_attention_types' expected list, got str \(value: 'full'\)",
    ),
    "a layer attention type that is no name": (
        EfficientBertConfig,
        dict(num_hidden_layers=2, layer_attention_types=["full", 3]),
        r"layer_attention_types\[1\] must be an attention type name \(str\), got 3",
    ),
    "layer_attention_configs as a list": (
        EfficientBertConfig,
        dict(num_hidden_layers=2, layer_attention_types=["full", "linear"], layer_attention_configs=["x"]),
        r"Field 'layer_attention_configs' expected dict, got list",
    ),
    "a layer attention config that is no dict": (
        EfficientBertConfig,
        dict(
            num_hidden_layers=2,
            layer_attention_types=["full", "longformer"],
            layer_attention_configs={"longformer": 3},
        ),
        r"layer_attention_configs\['longformer'\] must be a dict .* got int: 3",
    ),
    "a dropout given as a string": (
        EfficientBertConfig,
        dict(hidden_dropout_prob="0.1"),
        r"Field 'hidden_dropout_prob' expected .*got str",
    ),
    "a dropout above 1": (
        EfficientBertConfig,
        dict(attention_probs_dropout_prob=1.5),
        r"attention_probs_dropout_prob is a dropout probability and must be in \[0, 1\), got 1.5",
    ),
    "no attention heads": (
        EfficientBertConfig,
        dict(num_attention_heads=0),
        r"num_attention_heads must be a positive int, got 0",
    ),
    "an empty vocabulary": (
        EfficientBertConfig,
        dict(vocab_size=0),
        r"vocab_size must be a positive int, got 0",
    ),
    "an unknown activation": (
        EfficientBertConfig,
        dict(hidden_act="gelux"),
        r"hidden_act='gelux' is not an activation.*gelu",
    ),
    "a zero LayerNorm epsilon": (
        EfficientBertConfig,
        dict(layer_norm_eps=0.0),
        r"layer_norm_eps must be > 0",
    ),
    "a padding id outside the vocabulary": (
        EfficientBertConfig,
        dict(vocab_size=10, pad_token_id=20),
        r"pad_token_id=20 is not a row of the vocab_size=10 word embeddings",
    ),
    "an attention type given as a number": (
        EfficientBertConfig,
        dict(attention_type=3),
        r"Field 'attention_type' expected str, got int",
    ),
    "a zero patch size": (
        EfficientViTConfig,
        dict(patch_size=0),
        r"patch_size must be a positive int, got 0",
    ),
    "no image channels": (
        EfficientViTConfig,
        dict(num_channels=0),
        r"num_channels must be a positive int, got 0",
    ),
    "a non-square image size": (
        EfficientViTConfig,
        dict(image_size=[224, 160]),
        r"Field 'image_size' expected int, got list",
    ),
    "a mask ratio of 1": (
        EfficientViTConfig,
        dict(mask_ratio=1.0),
        r"mask_ratio must be in \[0, 1\), got 1.0",
    ),
    "node features as a string": (
        EfficientGraphConfig,
        dict(node_feature_dim="3"),
        r"Field 'node_feature_dim' expected int, got str",
    ),
    "a float graph layer count": (
        EfficientGraphConfig,
        dict(num_hidden_layers=4.0),
        r"Field 'num_hidden_layers' expected int, got float",
    ),
}


@pytest.mark.parametrize("case", list(CONSTRUCTION_CASES))
def test_bad_fields_on_construction(case):
    config_class, fields, message = CONSTRUCTION_CASES[case]
    with pytest.raises(CONFIG_ERRORS, match=message):
        config_class(**fields)


def test_bad_fields_on_assignment():
    config = EfficientBertConfig(**TINY_BERT)
    with pytest.raises(
        CONFIG_ERRORS, match=r"Field 'num_hidden_layers' expected int, got float \(value: 2.5\)"
    ):
        config.num_hidden_layers = 2.5
    with pytest.raises(CONFIG_ERRORS, match=r"Field 'layer_attention_types' expected list, got str"):
        config.layer_attention_types = "full"


EDITED_JSON_CASES = {
    "a layer count as a string": (
        dict(num_hidden_layers="2"),
        r"Field 'num_hidden_layers' expected int, got str \(value: '2'\)",
    ),
    "a float layer count": (
        dict(num_hidden_layers=2.0),
        r"Field 'num_hidden_layers' expected int, got float",
    ),
    "attention_config as a string": (
        dict(attention_config="longformer"),
        r"Field 'attention_config' expected dict, got str",
    ),
    "layer_attention_types as a string": (
        dict(layer_attention_types="full"),
        r"Field 'layer_attention_types' expected list, got str",
    ),
    "a negative hidden size": (dict(hidden_size=-32), r"hidden_size must be a positive int, got -32"),
}


@pytest.mark.parametrize("loader", [EfficientBertConfig.from_pretrained, EfficientBertModel.from_pretrained])
@pytest.mark.parametrize("case", list(EDITED_JSON_CASES))
def test_bad_fields_in_an_edited_config_json(case, loader, tmp_path):
    """A hand-edited config.json: the error names the folder, the field, the value and the expected type."""
    EfficientBertConfig(**TINY_BERT).save_pretrained(tmp_path)
    edit, message = EDITED_JSON_CASES[case]
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **edit}))
    with pytest.raises(
        ValueError, match=rf"(?s)from_pretrained\('{tmp_path}'\): its config.json .*invalid.*{message}"
    ):
        loader(tmp_path)
    with pytest.raises(CONFIG_ERRORS, match=message):  # through the Auto classes: the field, value and type
        AutoConfig.from_pretrained(tmp_path)


def test_bad_keyword_override_in_from_pretrained(tmp_path):
    EfficientBertConfig(**TINY_BERT).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match=r"Field 'num_hidden_layers' expected int, got float \(value: 2.5\)"):
        EfficientBertConfig.from_pretrained(tmp_path, num_hidden_layers=2.5)
