"""EfficientBert decoders with cross-attention (``add_cross_attention``), and bert2bert EncoderDecoderModels.

Parity with transformers' BertLMHeadModel and bert2bert (same weights, BERT's parameter names), training and
cached generation through EncoderDecoderModel for every type that can serve cross-attention, the encoder's
keys projected once while generating, the encoder's padding, and what is refused.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from transformers import BertConfig, BertLMHeadModel, BertModel, EncoderDecoderModel
from transformers.cache_utils import EncoderDecoderCache

import hf_efficient
from hf_efficient import EfficientBertConfig, EfficientBertForCausalLM, EfficientBertModel, EfficientCache
from hf_efficient.errors import InputError

from ...attention.helpers import small_config
from ..helpers import CONFIG_ERRORS, assert_same_gradients
from .helpers import TINY_BERT, VOCAB, assert_close_real, left_padded_batch, tiny_causal_config, tiny_config

# transformers' EncoderDecoderModel warns on every call with labels (a note about its v4.12 loss change); ours
# to hide in the suite's output, not to fix
pytestmark = pytest.mark.filterwarnings("ignore:Version v4.12.0 introduces a better way:FutureWarning")

CROSS_TYPES = hf_efficient.cross_attention_types("text")
NO_DROPOUT = {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}
START, PAD = 2, 0


def encoder_batch(b=2, m=9, seed=0):
    """Encoder ids (b, m) and mask, the second row padded after 6 tokens."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, VOCAB, (b, m), generator=g)
    mask = torch.ones(b, m, dtype=torch.long)
    mask[1, 6:] = 0
    return ids.masked_fill(mask == 0, PAD), mask


def bert2bert(self_type="full", cross_type="full", **overrides) -> EncoderDecoderModel:
    encoder = EfficientBertModel(tiny_config(**overrides))
    decoder_config = tiny_causal_config(
        self_type, add_cross_attention=True, cross_attention_type=cross_type, **overrides
    )
    model = EncoderDecoderModel(encoder=encoder, decoder=EfficientBertForCausalLM(decoder_config))
    model.config.decoder_start_token_id, model.config.pad_token_id = START, PAD
    model.generation_config.decoder_start_token_id, model.generation_config.pad_token_id = START, PAD
    return model


def upstream_decoder_config(**overrides) -> BertConfig:
    return BertConfig(**TINY_BERT, **NO_DROPOUT, is_decoder=True, add_cross_attention=True, **overrides)


@pytest.mark.parametrize("attn_implementation", ["eager", "sdpa"])
def test_decoder_with_cross_attention_equals_bert_lm_head_model(tmp_path, attn_implementation):
    """A transformers BertLMHeadModel(add_cross_attention) checkpoint loads with every weight (BERT's
    crossattention.* names) and gives the same logits, encoder padding included."""
    torch.manual_seed(0)
    upstream = BertLMHeadModel(upstream_decoder_config()).eval()
    upstream.save_pretrained(tmp_path)
    ours = EfficientBertForCausalLM.from_pretrained(tmp_path, attn_implementation=attn_implementation).eval()
    assert ours.config.add_cross_attention and ours.config.cross_attention_type == "full"
    names = {name for name, _ in ours.named_parameters()}
    assert "bert.encoder.layer.1.crossattention.self.query.weight" in names
    assert "bert.encoder.layer.1.crossattention.output.LayerNorm.weight" in names
    ids, mask = torch.randint(5, VOCAB, (2, 7)), torch.ones(2, 7, dtype=torch.long)
    mask[0, 5:] = 0
    states = torch.randn(2, 9, TINY_BERT["hidden_size"])
    encoder_mask = encoder_batch()[1]
    kwargs = dict(attention_mask=mask, encoder_hidden_states=states, encoder_attention_mask=encoder_mask)
    with torch.no_grad():
        expected = upstream(ids, use_cache=False, **kwargs).logits
        got = ours(ids, use_cache=False, **kwargs).logits
        without_padding = ours(ids, attention_mask=mask, encoder_hidden_states=states, use_cache=False).logits
    assert_close_real(got, expected, mask, atol=1e-5, rtol=1e-5)
    assert (got[1] - without_padding[1]).abs().max() > 1e-3  # the encoder padding was honoured


@pytest.mark.parametrize("attention_type", ["full", "linear"])
def test_a_decoder_with_cross_attention_runs_as_a_plain_decoder_without_encoder_states(
    attention_type, tmp_path
):
    """Called without encoder_hidden_states, a decoder built with add_cross_attention skips its cross-attn
    as transformers' BertLMHeadModel does: its logits are upstream's (full) and those of the same weights
    without cross-attention; it makes an EfficientCache (no encoder keys to keep) and generates with and
    without it alike (and as upstream, for full)."""
    torch.manual_seed(0)
    upstream = BertLMHeadModel(upstream_decoder_config()).eval()
    upstream.save_pretrained(tmp_path)
    config = small_config(attention_type, causal=True)
    ours = EfficientBertForCausalLM.from_pretrained(
        tmp_path, attention_type=attention_type, attention_config=config
    )
    positions = TINY_BERT["max_position_embeddings"]
    plain = EfficientBertForCausalLM(
        tiny_causal_config(attention_type, **NO_DROPOUT, max_position_embeddings=positions)
    )
    plain.load_state_dict(ours.state_dict(), strict=False)  # every weight but the cross-attention's
    ids, mask = left_padded_batch()
    with torch.no_grad():
        got = ours.eval()(ids, attention_mask=mask, use_cache=True)
        assert_close_real(
            got.logits, plain.eval()(ids, attention_mask=mask).logits, mask, atol=1e-5, rtol=1e-5
        )
        if attention_type == "full":
            expected = upstream(ids, attention_mask=mask).logits
            assert_close_real(got.logits, expected, mask, atol=1e-5, rtol=1e-5)
    assert type(got.cache) is EfficientCache and got.cache.get_seq_length() == ids.shape[1]
    options = dict(attention_mask=mask, max_new_tokens=6, do_sample=False, pad_token_id=PAD)
    cached = ours.generate(ids, **options)
    assert torch.equal(cached, ours.generate(ids, use_cache=False, **options))
    if attention_type == "full":
        assert torch.equal(cached, upstream.generate(ids, **options))


def test_bert2bert_checkpoint_loads_into_ours_with_the_same_logits():
    """transformers' bert2bert (BertModel + BertLMHeadModel) state dict loads strictly into an
    EncoderDecoderModel of EfficientBertModel + EfficientBertForCausalLM: the same names, the same outputs."""
    torch.manual_seed(0)
    upstream = EncoderDecoderModel(
        encoder=BertModel(BertConfig(**TINY_BERT, **NO_DROPOUT)),
        decoder=BertLMHeadModel(upstream_decoder_config()),
    ).eval()
    ours = EncoderDecoderModel(
        encoder=EfficientBertModel(EfficientBertConfig(**TINY_BERT, **NO_DROPOUT)),
        decoder=EfficientBertForCausalLM(
            EfficientBertConfig(**TINY_BERT, **NO_DROPOUT, is_decoder=True, add_cross_attention=True)
        ),
    ).eval()
    ours.load_state_dict(upstream.state_dict(), strict=True)
    ids, mask = encoder_batch()
    decoder_ids = torch.randint(5, VOCAB, (2, 6))
    with torch.no_grad():
        expected = upstream(input_ids=ids, attention_mask=mask, decoder_input_ids=decoder_ids).logits
        got = ours(input_ids=ids, attention_mask=mask, decoder_input_ids=decoder_ids).logits
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    # and they generate alike, each from its own cache (transformers' DynamicCache, our EfficientCache)
    options = dict(max_new_tokens=8, do_sample=False, decoder_start_token_id=START, pad_token_id=PAD)
    with torch.no_grad():
        expected = upstream.generate(
            ids, attention_mask=mask, output_scores=True, return_dict_in_generate=True, **options
        )
        got = ours.generate(
            ids, attention_mask=mask, output_scores=True, return_dict_in_generate=True, **options
        )
    torch.testing.assert_close(got.sequences, expected.sequences, atol=0, rtol=0)
    torch.testing.assert_close(torch.stack(got.scores), torch.stack(expected.scores), atol=1e-5, rtol=1e-5)


# every type that can serve cross-attention, under a decoder of the same type, and the default (exact
# cross-attention) under a windowed decoder, as Longformer-Encoder-Decoder
PAIRS = [(t, t) for t in CROSS_TYPES] + [("longformer", "full")]


@pytest.mark.parametrize(("self_type", "cross_type"), PAIRS)
def test_bert2bert_trains_and_generates_the_same_with_and_without_cache(self_type, cross_type):
    torch.manual_seed(0)
    model = bert2bert(self_type, cross_type)
    ids, mask = encoder_batch()
    labels = torch.randint(5, VOCAB, (2, 6))
    loss = model.train()(input_ids=ids, attention_mask=mask, labels=labels).loss
    loss.backward()
    assert torch.isfinite(loss)
    cross = model.decoder.bert.encoder.layer[0].crossattention
    for projection in (cross.self.query, cross.self.key, cross.self.value, cross.output.dense):
        assert projection.weight.grad.abs().sum() > 0
    model.eval()
    generated = {}
    for use_cache in (True, False):
        with torch.no_grad():
            out = model.generate(
                ids, attention_mask=mask, max_new_tokens=8, do_sample=False, use_cache=use_cache,
                output_scores=True, return_dict_in_generate=True, eos_token_id=None,
            )  # fmt: skip
        generated[use_cache] = out
    torch.testing.assert_close(generated[True].sequences, generated[False].sequences, atol=0, rtol=0)
    cached, uncached = torch.stack(generated[True].scores), torch.stack(generated[False].scores)
    torch.testing.assert_close(cached, uncached, atol=1e-5, rtol=1e-5)
    assert generated[True].sequences[:, 1:].unique().numel() > 1  # not one token repeated
    with torch.no_grad():
        beams = [
            model.generate(ids, attention_mask=mask, max_new_tokens=6, num_beams=3, use_cache=use_cache)
            for use_cache in (True, False)
        ]
    torch.testing.assert_close(beams[0], beams[1], atol=0, rtol=0)


def test_the_encoders_keys_are_projected_once_while_generating():
    model = bert2bert("linear", "full").eval()
    ids, mask = encoder_batch()
    calls = []
    for layer in model.decoder.bert.encoder.layer:
        layer.crossattention.self.key.register_forward_hook(lambda *args: calls.append(1))
    for use_cache, projections in ((True, 2), (False, 2 * 5)):  # 2 layers; 5 steps without a cache
        calls.clear()
        with torch.no_grad():
            model.generate(ids, attention_mask=mask, max_new_tokens=5, do_sample=False, use_cache=use_cache)
        assert len(calls) == projections
    decoder_ids = torch.full((2, 1), START)
    states = model.encoder(ids, attention_mask=mask).last_hidden_state
    with torch.no_grad():
        out = model.decoder(decoder_ids, encoder_hidden_states=states, encoder_attention_mask=mask)
    cache = out.cache  # transformers' EncoderDecoderCache: the decoder's own state, the encoder's keys
    assert isinstance(cache, EncoderDecoderCache) and isinstance(cache.self_attention_cache, EfficientCache)
    assert cache.cross_attention_cache.layers[0].keys.shape == (2, TINY_BERT["num_attention_heads"], 9, 8)


@pytest.mark.parametrize("cross_type", CROSS_TYPES)
def test_encoder_padding_changes_nothing(cross_type):
    """Padded encoder positions (whatever they hold) leave the decoder's outputs as they are without them."""
    torch.manual_seed(0)
    decoder = EfficientBertForCausalLM(
        tiny_causal_config(add_cross_attention=True, cross_attention_type=cross_type)
    ).eval()
    states, mask = torch.randn(2, 9, TINY_BERT["hidden_size"]), encoder_batch()[1]
    poisoned = states.clone()
    poisoned[1, 6:] = 100.0
    ids = torch.randint(5, VOCAB, (2, 5))
    with torch.no_grad():
        padded = decoder(ids, encoder_hidden_states=states, encoder_attention_mask=mask).logits
        garbage = decoder(ids, encoder_hidden_states=poisoned, encoder_attention_mask=mask).logits
        alone = decoder(ids[1:], encoder_hidden_states=states[1:, :6]).logits
    torch.testing.assert_close(garbage, padded)
    torch.testing.assert_close(padded[1:], alone, atol=1e-5, rtol=1e-5)


def test_from_encoder_decoder_pretrained_on_local_folders(tmp_path):
    """Two saved EfficientBert encoders become a bert2bert: the decoder gets causal attention and new
    cross-attention layers (through the Auto classes hf_efficient registers), and trains."""
    EfficientBertModel(tiny_config()).save_pretrained(tmp_path / "encoder")
    EfficientBertModel(tiny_config("linear")).save_pretrained(tmp_path / "decoder")
    model = EncoderDecoderModel.from_encoder_decoder_pretrained(tmp_path / "encoder", tmp_path / "decoder")
    assert isinstance(model.encoder, EfficientBertModel)
    assert isinstance(model.decoder, EfficientBertForCausalLM)
    assert model.decoder.config.add_cross_attention and model.decoder.config.attention_type == "linear"
    model.config.decoder_start_token_id, model.config.pad_token_id = START, PAD
    ids, mask = encoder_batch()
    loss = model.train()(input_ids=ids, attention_mask=mask, labels=torch.randint(5, VOCAB, (2, 4))).loss
    loss.backward()
    assert torch.isfinite(loss)
    assert model.decoder.bert.encoder.layer[1].crossattention.self.key.weight.grad.abs().sum() > 0


def test_cross_attention_config_is_checked():
    with pytest.raises(CONFIG_ERRORS, match="needs is_decoder=True"):
        tiny_config(add_cross_attention=True)
    with pytest.raises(CONFIG_ERRORS, match="'longformer' cannot serve cross-attention: its sliding window"):
        tiny_causal_config(add_cross_attention=True, cross_attention_type="longformer")
    with pytest.raises(CONFIG_ERRORS, match="Types that can: full, linear, performer, rfa"):
        tiny_causal_config(add_cross_attention=True, cross_attention_type="nystromformer")
    with pytest.raises(CONFIG_ERRORS, match="num_features"):
        tiny_causal_config(
            add_cross_attention=True,
            cross_attention_type="performer",
            cross_attention_config={"num_features": 0},
        )
    config = tiny_causal_config(
        "longformer", add_cross_attention=True, cross_attention_type="performer",
        cross_attention_config={"num_features": 8},
    )  # fmt: skip
    core = EfficientBertForCausalLM(config).bert.encoder.layer[0].crossattention.self.core
    assert core.attention_type == "performer" and core.config.num_features == 8 and core.spec.cross_attention


def test_encoder_states_are_checked():
    decoder = EfficientBertForCausalLM(tiny_causal_config(add_cross_attention=True)).eval()
    plain = EfficientBertForCausalLM(tiny_causal_config()).eval()
    ids, states, mask = torch.randint(5, VOCAB, (2, 4)), torch.randn(2, 9, 32), encoder_batch()[1]
    with pytest.raises(InputError, match="encoder_attention_mask was given without encoder_hidden_states"):
        decoder(ids, encoder_attention_mask=mask)
    with pytest.raises(InputError, match="has no cross-attention"):
        plain(ids, encoder_hidden_states=states)
    with pytest.raises(InputError, match=r"encoder_hidden_states must have shape .* got \(2, 9, 16\)"):
        decoder(ids, encoder_hidden_states=torch.randn(2, 9, 16))
    with pytest.raises(
        InputError, match=r"encoder_attention_mask must have shape .* \(2, 9\) .* got \(2, 8\)"
    ):
        decoder(ids, encoder_hidden_states=states, encoder_attention_mask=mask[:, :8])


def test_a_saved_bert2bert_loads_with_its_cross_attention(tmp_path):
    """save_pretrained / EncoderDecoderModel.from_pretrained keep the cross-attention type, its random state
    (performer's features) and every weight: the same logits."""
    model = bert2bert("rfa", "performer").eval()
    model.save_pretrained(tmp_path)
    loaded = EncoderDecoderModel.from_pretrained(tmp_path).eval()
    assert isinstance(loaded.decoder, EfficientBertForCausalLM)
    assert loaded.decoder.config.cross_attention_type == "performer"
    ids, mask = encoder_batch()
    decoder_ids = torch.randint(5, VOCAB, (2, 4))
    with torch.no_grad():
        expected = model(input_ids=ids, attention_mask=mask, decoder_input_ids=decoder_ids).logits
        got = loaded(input_ids=ids, attention_mask=mask, decoder_input_ids=decoder_ids).logits
    torch.testing.assert_close(got, expected, atol=0, rtol=0)


@pytest.mark.parametrize("reentrant", [False, True])
def test_gradient_checkpointing_gives_the_same_gradients(reentrant):
    """EncoderDecoderModel gives the decoder no labels, so training would make a cache by default; recomputed
    layers must not fill one (nor read the encoder's keys from it): the gradients equal plain ones."""
    torch.manual_seed(0)
    model = bert2bert("linear", "full", **NO_DROPOUT).train()
    ids, mask = encoder_batch()
    labels = torch.randint(5, VOCAB, (2, 5))

    def gradients():
        model.zero_grad()
        model(input_ids=ids, attention_mask=mask, labels=labels).loss.backward()
        return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}

    plain = gradients()
    with warnings.catch_warnings():  # transformers 5.23 renamed it activation_checkpointing_enable
        warnings.simplefilter("ignore", FutureWarning)
        # reentrant: the encoder's states reach each layer as a positional tensor, so their gradient flows
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": reentrant})
    assert_same_gradients(gradients(), plain)
    model.decoder.attention_checkpointing_enable()  # the cores' own recomputation, cross-attention's included
    assert model.decoder.bert.encoder.layer[0].crossattention.self.checkpoint_core
    assert_same_gradients(gradients(), plain)
    with pytest.raises(InputError, match="use_cache=True cannot be combined with gradient checkpointing"):
        model(input_ids=ids, attention_mask=mask, labels=labels, use_cache=True)
