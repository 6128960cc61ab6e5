"""BERT's relative position embeddings (``position_embedding_type="relative_key"``, Shaw et al. 2018;
``"relative_key_query"``, Huang et al. 2020) against transformers 4's BERT, which built them
(tests/models/text/relative_bert.py: transformers 5 dropped them).

A checkpoint of every BERT head loads strictly into ours with equal outputs (1e-5) and what we save loads back
into transformers' class strictly with the same outputs; the types whose cores add relative scores (full,
longformer) load it, longformer equal to full while its window covers the input; the other types are refused
naming why; a decoder generates the same tokens with and without its cache.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from transformers import BertForNextSentencePrediction, BertForPreTraining, BertLMHeadModel

import hf_efficient
from hf_efficient import EfficientBertConfig, EfficientBertForCausalLM, EfficientBertModel
from hf_efficient.errors import InputError

from ..helpers import CONFIG_ERRORS
from .families import BERT_HEADS, TEXT_FAMILIES, randomise_zero_init
from .relative_bert import RELATIVE_TYPES, relative_bert
from .test_families import assert_same_outputs, forward

HEADS = {
    **BERT_HEADS,
    BertForPreTraining: "EfficientBertForPreTraining",
    BertForNextSentencePrediction: "EfficientBertForNextSentencePrediction",
}
NO_INFO = ("missing_keys", "unexpected_keys", "mismatched_keys")


def relative_family(kind: str):
    """The BERT family of tests/models/text/families.py with relative positions of ``kind``, every head."""
    bert = TEXT_FAMILIES["bert"]
    sizes = {**bert.sizes, "position_embedding_type": kind, "attn_implementation": "eager"}
    return dataclasses.replace(bert, name=f"bert-{kind}", sizes=sizes, heads=HEADS)


def relative_checkpoint(family, upstream: type, folder) -> torch.nn.Module:
    """transformers 4's tiny ``upstream`` model with relative positions, saved in ``folder``: biases and norms
    randomised, the distance tables of standard deviation 0.5 (BERT initialises them at 0.02, where their
    scores are too small for a wrong distance to show at 1e-5)."""
    torch.manual_seed(0)
    with relative_bert():
        model = upstream(family.config(upstream)).eval()
    randomise_zero_init(model)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "distance_embedding" in name:
                param.mul_(25.0)
    model.save_pretrained(folder)
    return model


def compared_outputs(inputs: dict) -> list[str] | None:
    """The outputs compared: all of them, but for question answering the logits only (transformers' span
    loss softmaxes over padded positions, whose logits are meaningless)."""
    return ["start_logits", "end_logits"] if "start_positions" in inputs else None


@pytest.mark.parametrize("upstream", list(HEADS), ids=lambda cls: cls.__name__)
@pytest.mark.parametrize("kind", RELATIVE_TYPES)
def test_relative_checkpoint_loads_strictly_with_equal_outputs_and_saves_back(kind, upstream, tmp_path):
    family = relative_family(kind)
    reference = relative_checkpoint(family, upstream, tmp_path / "upstream")
    assert any(name.endswith("attention.self.distance_embedding.weight") for name in reference.state_dict())
    our_class = family.ours(upstream)
    ours, info = our_class.from_pretrained(tmp_path / "upstream", output_loading_info=True)
    assert ours.config.position_embedding_type == kind and ours.config.attention_type == "full"
    assert not any(info[key] for key in NO_INFO), info
    inputs, mask = family.inputs(our_class)
    expected = forward(reference, inputs)
    assert_same_outputs(forward(ours, inputs), expected, mask, compared_outputs(inputs))

    ours.save_pretrained(tmp_path / "ours")
    with relative_bert():
        back, info = upstream.from_pretrained(tmp_path / "ours", output_loading_info=True)
    assert not any(info[key] for key in NO_INFO), info
    assert back.config.position_embedding_type == kind
    assert_same_outputs(forward(back, inputs), expected, mask, compared_outputs(inputs))


@pytest.mark.parametrize("kind", RELATIVE_TYPES)
def test_longformer_loads_relative_checkpoints_and_other_types_are_refused(kind, tmp_path):
    """longformer takes the checkpoint (only its own parameters new) and equals full while its window covers
    the 20 tokens; a type that never forms the scores is refused, naming why and the types that can."""
    family = relative_family(kind)
    relative_checkpoint(family, next(iter(HEADS)), tmp_path)  # BertModel
    inputs, mask = family.inputs(EfficientBertModel)
    exact = forward(EfficientBertModel.from_pretrained(tmp_path), inputs).last_hidden_state
    window = {"attention_window": 40, "global_token_indices": [0]}
    windowed = EfficientBertModel.from_pretrained(
        tmp_path, attention_type="longformer", attention_config=window
    )
    got = forward(windowed, inputs).last_hidden_state
    torch.testing.assert_close(got[mask.bool()], exact[mask.bool()], atol=1e-5, rtol=1e-5)
    narrow = {"attention_window": 4, "global_token_indices": [0]}
    narrowed = EfficientBertModel.from_pretrained(
        tmp_path, attention_type="longformer", attention_config=narrow
    )
    assert not torch.allclose(forward(narrowed, inputs).last_hidden_state[mask.bool()], exact[mask.bool()])
    assert hf_efficient.relative_position_types("text") == ["full", "longformer"]
    with pytest.raises(InputError, match="'linear' cannot add relative position scores: it never forms"):
        EfficientBertModel.from_pretrained(tmp_path, attention_type="linear")
    with pytest.raises(
        CONFIG_ERRORS, match="'bigbird' cannot add relative .* Types that can: full, longformer"
    ):
        EfficientBertConfig(
            num_hidden_layers=2, position_embedding_type=kind, layer_attention_types=["full", "bigbird"]
        )
    with pytest.raises(CONFIG_ERRORS, match="position_embedding_type='rotary' is not one of BERT's"):
        EfficientBertConfig(position_embedding_type="rotary")
    with pytest.raises(InputError, match="relative positions .* which copying cannot extend"):
        EfficientBertModel.from_pretrained(tmp_path).resize_position_embeddings(128)


@pytest.mark.parametrize("attention_type", ["full", "longformer"])
def test_relative_decoder_generates_the_same_tokens_with_and_without_its_cache(attention_type, tmp_path):
    """A relative_key_query decoder of each type: cached greedy generation, which decodes the new tokens at
    positions after the cached ones, gives transformers 4's tokens for full (computed without a cache)."""
    family = relative_family("relative_key_query")
    reference = relative_checkpoint(family, BertLMHeadModel, tmp_path)
    config = {"attention_window": 6} if attention_type == "longformer" else {}
    ours = EfficientBertForCausalLM.from_pretrained(
        tmp_path, attention_type=attention_type, attention_config=config
    ).eval()
    ids = torch.randint(5, 99, (2, 5), generator=torch.Generator().manual_seed(0))
    settings = dict(max_new_tokens=12, do_sample=False, pad_token_id=0)
    cached = ours.generate(ids, use_cache=True, **settings)
    assert torch.equal(cached, ours.generate(ids, use_cache=False, **settings))
    if attention_type == "full":
        assert torch.equal(cached, reference.generate(ids, use_cache=False, **settings))
