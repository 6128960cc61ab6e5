"""ModernBERT beyond the family table (tests/models/text/families.py): its own window of 128 tokens past its
reach, the checkpoint's pattern kept and recorded, its global or window layers on other types, positions
past the checkpoint's length, and what a ModernBERT config refuses."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import ModernBertConfig, ModernBertForMaskedLM, ModernBertModel

from hf_efficient import EfficientModernBertConfig, EfficientModernBertForMaskedLM, EfficientModernBertModel
from hf_efficient.errors import InputError

from ..helpers import CONFIG_ERRORS
from .families import MODERNBERT_SIZES, TEXT_FAMILIES
from .helpers import assert_close_real

CLOSE = dict(atol=1e-5, rtol=1e-5)
MODERNBERT = TEXT_FAMILIES["modernbert"]


def checkpoint(folder, upstream=ModernBertModel, **fields) -> torch.nn.Module:
    """transformers' tiny ModernBERT (the family's sizes, ``fields`` over them), its biases and norms
    randomised, saved in ``folder``."""
    return MODERNBERT.checkpoint(upstream, folder, **fields)


def padded(n: int, lengths: list[int], seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, MODERNBERT_SIZES["vocab_size"], (len(lengths), n), generator=g)
    mask = (torch.arange(n)[None] < torch.tensor(lengths)[:, None]).long()
    return ids.masked_fill(mask == 0, 0), mask


def cores_of(model) -> list[tuple[str, dict]]:
    return [(core.attention_type, core.config.to_dict()) for core in model.attention_cores()]


@pytest.mark.parametrize("sparse_prediction", [False, True])
def test_default_window_past_its_reach_equals_transformers(tmp_path, sparse_prediction):
    """ModernBERT's own window (local_attention 128: 64 keys on each side) on 300-token padded inputs: the
    window layers on the Longformer kernel, the global ones exact, equal to transformers' sdpa path; the
    masked LM's logits (all positions, or the masked ones with sparse_prediction) and loss too."""
    fields = dict(
        local_attention=128,
        max_position_embeddings=512,
        num_hidden_layers=3,
        sparse_prediction=sparse_prediction,
    )
    reference = checkpoint(tmp_path, ModernBertForMaskedLM, **fields)
    ours = EfficientModernBertForMaskedLM.from_pretrained(tmp_path).eval()
    assert [name for name, _ in cores_of(ours)] == ["full", "longformer", "longformer"]
    assert cores_of(ours)[1][1]["attention_window"] == 128
    ids, mask = padded(300, [300, 211])
    labels = ids.masked_fill(
        (torch.rand(ids.shape, generator=torch.Generator().manual_seed(1)) < 0.7) | (mask == 0), -100
    )
    with torch.no_grad():
        expected = reference(input_ids=ids, attention_mask=mask, labels=labels)
        got = ours(input_ids=ids, attention_mask=mask, labels=labels)
        hidden = ours.model(input_ids=ids, attention_mask=mask).last_hidden_state
        expected_hidden = reference.model(input_ids=ids, attention_mask=mask).last_hidden_state
    assert_close_real(hidden, expected_hidden, mask, **CLOSE)
    torch.testing.assert_close(got.loss, expected.loss, **CLOSE)
    if sparse_prediction:
        assert got.logits.shape == expected.logits.shape == (int((labels != -100).sum()), 99)
        torch.testing.assert_close(got.logits, expected.logits, **CLOSE)
    else:
        assert_close_real(got.logits, expected.logits, mask, **CLOSE)


def test_saved_config_records_the_layers_attention(tmp_path):
    """No override: the checkpoint's pattern, recorded in the saved config (global layers exact, window layers
    Longformer with ModernBERT's window), which transformers' ModernBERT reads as its own."""
    checkpoint(tmp_path / "upstream", num_hidden_layers=4)
    ours = EfficientModernBertModel.from_pretrained(tmp_path / "upstream")
    assert [name for name, _ in cores_of(ours)] == ["full", "longformer", "longformer", "full"]
    assert {"attention_window": 8, "global_token_indices": []}.items() <= cores_of(ours)[1][1].items()
    ours.save_pretrained(tmp_path / "ours")
    saved = json.loads((tmp_path / "ours" / "config.json").read_text())
    assert saved["layer_types"] == [
        "full_attention",
        "sliding_attention",
        "sliding_attention",
        "full_attention",
    ]
    assert (saved["attention_type"], saved["local_attention_type"], saved["local_attention"]) == (
        "full",
        "longformer",
        8,
    )
    upstream = ModernBertConfig.from_pretrained(tmp_path / "ours")
    assert upstream.layer_types == saved["layer_types"] and upstream.sliding_window == 4


def test_global_and_window_layers_take_other_types(tmp_path):
    """attention_type replaces the global layers' exact attention, local_attention_type the window layers';
    layer_attention_types names one per layer (longformer then takes the window's config); the saved config
    loads back with the same cores."""
    checkpoint(tmp_path / "upstream", num_hidden_layers=4)
    bigbird = {"block_size": 4, "num_random_blocks": 1}
    ours = EfficientModernBertModel.from_pretrained(
        tmp_path / "upstream", attention_type="bigbird", attention_config=bigbird
    )
    assert [name for name, _ in cores_of(ours)] == ["bigbird", "longformer", "longformer", "bigbird"]
    ours.save_pretrained(tmp_path / "ours")
    assert cores_of(EfficientModernBertModel.from_pretrained(tmp_path / "ours")) == cores_of(ours)
    linear = EfficientModernBertModel.from_pretrained(tmp_path / "upstream", local_attention_type="linear")
    assert [name for name, _ in cores_of(linear)] == ["full", "linear", "linear", "full"]
    per_layer = EfficientModernBertModel.from_pretrained(
        tmp_path / "upstream", layer_attention_types=["performer", "longformer", "full", "full"]
    )
    assert [name for name, _ in cores_of(per_layer)] == ["performer", "longformer", "full", "full"]
    assert cores_of(per_layer)[1][1]["attention_window"] == 8
    ids, mask = padded(20, [20, 13])
    for model in (ours, linear, per_layer):
        out = model(input_ids=ids, attention_mask=mask).last_hidden_state
        assert torch.isfinite(out).all()


def test_global_blocks_covering_the_text_are_the_checkpoint(tmp_path):
    """BigBird whose global blocks cover the input is exact attention: on its global layers the model is
    transformers' ModernBERT again (the limiting case of an efficient global type, rotary positions and
    all)."""
    reference = checkpoint(tmp_path)
    ours = EfficientModernBertModel.from_pretrained(
        tmp_path, attention_type="bigbird", attention_config={"block_size": 16}
    )
    ids, mask = padded(20, [20, 13, 7])
    with torch.no_grad():
        expected = reference(input_ids=ids, attention_mask=mask).last_hidden_state
        got = ours(input_ids=ids, attention_mask=mask).last_hidden_state
    assert_close_real(got, expected, mask, **CLOSE)


def test_positions_past_the_checkpoint_length_are_relative(tmp_path):
    """Rotary positions have no table: an efficient global type reads past max_position_embeddings (64 here),
    and shifting every position (position_ids) changes nothing, RoPE depending on relative positions only."""
    checkpoint(tmp_path)
    model = EfficientModernBertModel.from_pretrained(
        tmp_path, attention_type="bigbird", attention_config={"block_size": 8}
    ).eval()
    ids, mask = padded(100, [100, 77])
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask).last_hidden_state
        shifted = model(
            input_ids=ids, attention_mask=mask, position_ids=torch.arange(100)[None] + 37
        ).last_hidden_state
    assert torch.isfinite(out).all()
    assert_close_real(shifted, out, mask, **CLOSE)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (
            {"attention_type": "linformer"},
            r"layer 0 \(full_attention\): attention_type 'linformer' cannot carry rotary",
        ),
        (
            {"local_attention_type": "reformer_lsh"},
            r"layer 1 \(sliding_attention\): .*reformer_lsh' cannot carry",
        ),
        (
            {"local_attention_config": {"attention_window": 16}},
            "attention_window=16 differs from ModernBERT's window, local_attention=8",
        ),
        ({"sparse_pred_ignore_index": -1}, "sparse_pred_ignore_index=-1"),
        (
            {"rope_parameters": {"full_attention": {"rope_type": "dynamic", "factor": 2.0}}},
            "rope_type='dynamic'",
        ),
        ({"layer_types": ["full_attention", "chunked_attention"]}, "one kind per layer"),
        ({"local_attention": 1}, "local_attention=1"),
    ],
)
def test_config_refuses_what_it_cannot_honour(fields, message):
    with pytest.raises(CONFIG_ERRORS, match=message):
        EfficientModernBertConfig(**{**MODERNBERT_SIZES, **fields})


def test_older_configs_read_as_transformers_reads_them():
    """A config.json of the older format (global_attn_every_n_layers, global_rope_theta, local_rope_theta)
    gives transformers' layer kinds and thetas."""
    older = dict(
        MODERNBERT_SIZES,
        num_hidden_layers=5,
        global_attn_every_n_layers=2,
        global_rope_theta=1e5,
        local_rope_theta=5e3,
    )
    ours, theirs = EfficientModernBertConfig(**older), ModernBertConfig(**older)
    assert ours.layer_types == theirs.layer_types
    assert ours.rope_parameters == theirs.rope_parameters


def test_token_types_are_refused_naming_the_fix(tmp_path):
    checkpoint(tmp_path)
    ids, mask = padded(10, [10])
    with pytest.raises(InputError, match="no token type embeddings"):
        EfficientModernBertModel.from_pretrained(tmp_path)(
            input_ids=ids, token_type_ids=torch.zeros_like(ids)
        )


def test_an_odd_head_size_is_refused_when_the_model_is_built():
    config = EfficientModernBertConfig(**{**MODERNBERT_SIZES, "hidden_size": 36, "num_attention_heads": 12})
    with pytest.raises(InputError, match="= 3 must be even: rotary positions turn pairs"):
        EfficientModernBertModel(config)
