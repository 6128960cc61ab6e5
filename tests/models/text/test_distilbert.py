"""DistilBERT's own config and positions beside the family checks of tests/models/text/test_families.py: its
field names under BERT's (attribute_map), what it fixes (no token types, no decoder, LayerNorm's 1e-12), and
the sinusoidal position table (built as transformers builds it, loaded, extended)."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import DistilBertConfig, DistilBertModel

from hf_efficient import EfficientDistilBertConfig, EfficientDistilBertForMaskedLM, EfficientDistilBertModel
from hf_efficient.errors import InputError
from hf_efficient.models.text.modeling_efficient_distilbert import sinusoidal_positions

from ..helpers import CONFIG_ERRORS
from .families import DISTILBERT_SIZES, TEXT_FAMILIES
from .helpers import assert_close_real, batch

DISTILBERT = TEXT_FAMILIES["distilbert"]
CLOSE = dict(atol=1e-5, rtol=1e-5)


def test_a_distilbert_config_loads_with_its_own_field_names(tmp_path):
    DistilBertConfig(**DISTILBERT_SIZES, qa_dropout=0.25, seq_classif_dropout=0.3).save_pretrained(tmp_path)
    config = EfficientDistilBertConfig.from_pretrained(tmp_path)
    assert (config.dim, config.n_layers, config.n_heads, config.hidden_dim) == (32, 2, 4, 37)
    assert (config.activation, config.qa_dropout, config.seq_classif_dropout) == ("silu", 0.25, 0.3)
    # what the shared blocks read, under BERT's names
    assert (config.hidden_size, config.num_hidden_layers, config.num_attention_heads) == (32, 2, 4)
    assert (config.intermediate_size, config.hidden_act, config.type_vocab_size) == (37, "silu", 0)
    config.hidden_size = 64  # BERT's name sets DistilBERT's field: what is saved is DistilBERT's
    saved = config.to_dict()
    assert saved["dim"] == 64 and "hidden_size" not in saved and "intermediate_size" not in saved


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"is_decoder": True}, "DistilBERT is an encoder: is_decoder / add_cross_attention"),
        ({"type_vocab_size": 2}, "type_vocab_size=2: DistilBERT has no token type embeddings"),
        ({"seq_classif_dropout": 1.2}, r"seq_classif_dropout is a dropout probability .* got 1.2"),
        ({"dim": 30}, "hidden_size=30 is not a multiple of num_attention_heads=4"),
    ],
    ids=["decoder", "token types", "dropout", "heads"],
)
def test_what_distilbert_fixes_is_refused(fields, message):
    with pytest.raises(CONFIG_ERRORS, match=message):
        EfficientDistilBertModel(EfficientDistilBertConfig(**{**DISTILBERT_SIZES, **fields}))


def test_layer_norm_epsilon_is_fixed_as_in_transformers():
    """transformers' DistilBERT ignores a ``layer_norm_eps`` set on its config (its mixin's tests set one)."""
    config = EfficientDistilBertConfig(**DISTILBERT_SIZES, layer_norm_eps=1.0)
    norms = [m for m in EfficientDistilBertForMaskedLM(config).modules() if isinstance(m, torch.nn.LayerNorm)]
    assert len(norms) == 2 * 2 + 2 and all(norm.eps == 1e-12 for norm in norms)


def test_token_type_ids_are_refused():
    model, (ids, mask) = EfficientDistilBertModel(EfficientDistilBertConfig(**DISTILBERT_SIZES)), batch()
    assert not hasattr(model.embeddings, "token_type_embeddings")
    with pytest.raises(InputError, match="token_type_ids were given, but this model has no token type"):
        model(ids, attention_mask=mask, token_type_ids=torch.zeros_like(ids))


def test_sinusoidal_table_is_transformers_and_loads(tmp_path):
    torch.manual_seed(0)
    theirs = DistilBertModel(DistilBertConfig(**DISTILBERT_SIZES, sinusoidal_pos_embds=True)).eval()
    table = theirs.embeddings.position_embeddings.weight
    config = EfficientDistilBertConfig(**DISTILBERT_SIZES, sinusoidal_pos_embds=True)
    for ours in (EfficientDistilBertModel(config), EfficientDistilBertForMaskedLM(config)):
        torch.testing.assert_close(ours.get_position_embeddings().weight, table, atol=1e-6, rtol=0)
        assert ours.get_position_embeddings().weight.requires_grad  # trained, as transformers' (5.x)
    with torch.no_grad():
        table.add_(0.01 * torch.randn_like(table))  # a trained table: loading must keep it, not recompute it
    theirs.save_pretrained(tmp_path)
    loaded = EfficientDistilBertModel.from_pretrained(tmp_path).eval()
    torch.testing.assert_close(loaded.embeddings.position_embeddings.weight, table, atol=0, rtol=0)
    ids, mask = batch()
    with torch.no_grad():
        expected = theirs(ids, attention_mask=mask).last_hidden_state
        assert_close_real(loaded(ids, attention_mask=mask).last_hidden_state, expected, mask, **CLOSE)


def test_resize_position_embeddings_extends_sinusoids_and_copies_learned_rows(tmp_path):
    sinusoidal = EfficientDistilBertModel(
        EfficientDistilBertConfig(**DISTILBERT_SIZES, sinusoidal_pos_embds=True)
    )
    sinusoidal.resize_position_embeddings(100)
    assert sinusoidal.config.max_position_embeddings == 100
    torch.testing.assert_close(
        sinusoidal.embeddings.position_embeddings.weight, sinusoidal_positions(100, 32)
    )
    learned = EfficientDistilBertModel(EfficientDistilBertConfig(**DISTILBERT_SIZES))
    rows = learned.embeddings.position_embeddings.weight.detach().clone()  # (64, D)
    learned.resize_position_embeddings(100)
    table = learned.embeddings.position_embeddings.weight
    torch.testing.assert_close(table[:64], rows, atol=0, rtol=0)
    torch.testing.assert_close(table[64:], rows[:36], atol=0, rtol=0)
    ids = torch.randint(5, 99, (1, 90))
    assert learned(ids).last_hidden_state.shape == (1, 90, 32)
    learned.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["max_position_embeddings"] == 100
