"""EfficientBertForCausalLM: transformers' BertLMHeadModel with any attention type that has a causal form,
with generate() decoding from each core's own state.

The per-type checks (tests/models/text/checks.py) run for every causal type; here also: parity with
BertLMHeadModel (same weights), what a decoder refuses, and loading a saved causal model in a fresh process,
through remote code too.
"""

from __future__ import annotations

import pytest
import torch
from transformers import BertConfig, BertLMHeadModel, DynamicCache

import hf_efficient
from hf_efficient import EfficientBertForCausalLM, EfficientBertModel

from ...processes import BLOCK_HF_EFFICIENT, run_python
from ..helpers import CONFIG_ERRORS
from . import checks
from .helpers import TINY_BERT, decode_token_by_token, left_padded_batch, tiny_causal_config, tiny_config

CAUSAL_TYPES = hf_efficient.causal_attention_types("text")


def test_causal_types():
    assert CAUSAL_TYPES == ["full", "linear", "longformer", "performer", "rfa"]


@pytest.mark.parametrize("attention_type", CAUSAL_TYPES)
def test_causal_lm_loss_and_grads(attention_type):
    checks.check_causal_lm_loss_and_grads(attention_type)


def test_causal_lm_training_keeps_no_vocabulary_sized_tensor():
    """Training with labels saves nothing of (b, n, V) for backward (the fused chunked loss), while the same
    loss through the dense logits saves them; both give the same value."""
    vocab, n = 4096, 64
    model = EfficientBertForCausalLM(
        tiny_causal_config(
            "linear", vocab_size=vocab, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0
        )
    )
    ids = torch.randint(5, vocab, (2, n))
    largest = []

    def pack(tensor):
        if vocab in tensor.shape and tensor.dim() >= 2 and tensor.shape[-1] != model.config.hidden_size:
            largest.append(tensor.numel())
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        fused = model.train()(ids, labels=ids).loss
    fused.backward()
    assert max(largest, default=0) == 0
    assert model.bert.embeddings.word_embeddings.weight.grad.abs().sum() > 0
    with torch.no_grad():
        dense = model.eval()(ids, labels=ids).loss  # eval mode: BERT's logits, then the loss
    torch.testing.assert_close(fused, dense)


@pytest.mark.parametrize("attention_type", CAUSAL_TYPES)
def test_decoding_200_steps_equals_parallel_forward(attention_type):
    checks.check_causal_lm_decoding_matches_parallel(attention_type)


@pytest.mark.parametrize("attention_type", CAUSAL_TYPES)
def test_generate_features(attention_type):
    checks.check_generate_features(attention_type)


@pytest.mark.parametrize("attention_type", CAUSAL_TYPES)
def test_causal_save_load_through_auto_classes(attention_type, tmp_path):
    checks.check_causal_save_load_through_auto_classes(attention_type, tmp_path)


def bert_pair() -> tuple[BertLMHeadModel, EfficientBertForCausalLM]:
    """transformers' BertLMHeadModel and ours (full attention) with the same random weights."""
    reference = BertLMHeadModel(BertConfig(**TINY_BERT, is_decoder=True)).eval()
    with torch.no_grad():
        reference.cls.predictions.bias.normal_()  # a trained, non-zero decoder bias must be carried over
    ours = EfficientBertForCausalLM(tiny_config("full", is_decoder=True)).eval()
    ours.load_state_dict(reference.state_dict())
    return reference, ours


def test_full_equals_bert_lm_head_model_with_and_without_cache():
    """Same weights: logits equal to 1e-5 over a left-padded batch, in one pass and token by token through
    each model's own cache (transformers' DynamicCache, our EfficientCache); the loss of the same labels; and
    greedy generate() gives the same tokens."""
    reference, ours = bert_pair()
    ids, mask = left_padded_batch(lengths=(16, 11))
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    real = mask.bool()
    with torch.no_grad():
        expected = reference(ids, attention_mask=mask, position_ids=positions).logits
        got = ours(ids, attention_mask=mask, position_ids=positions).logits
        torch.testing.assert_close(got[real], expected[real], atol=1e-5, rtol=1e-5)
        cached = {
            name: decode_token_by_token(model, ids, mask, 6)
            for name, model in (("reference", reference), ("ours", ours))
        }
        assert isinstance(cached["ours"][1], hf_efficient.EfficientCache)
        cached = {name: logits for name, (logits, _) in cached.items()}
        torch.testing.assert_close(cached["ours"][real], cached["reference"][real], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(cached["ours"][real], expected[real], atol=1e-5, rtol=1e-5)
    labels = ids.masked_fill(mask == 0, -100)
    torch.testing.assert_close(
        ours(ids, attention_mask=mask, labels=labels).loss,
        reference(ids, attention_mask=mask, labels=labels).loss,
    )
    settings = dict(attention_mask=mask, max_new_tokens=15, do_sample=False, pad_token_id=0)
    assert torch.equal(ours.generate(ids, **settings), reference.generate(ids, **settings))


def test_assisted_decoding_with_a_croppable_cache_gives_greedys_tokens():
    """full keeps keys and values, which assisted decoding crops back after a rejected draft: with itself as
    the assistant every draft is accepted, and the tokens are greedy decoding's."""
    torch.manual_seed(0)
    decoder = EfficientBertForCausalLM(tiny_causal_config("full")).eval()
    ids = left_padded_batch()[0][:1]  # assisted decoding takes one prompt at a time (unpadded)
    greedy_settings = {"max_new_tokens": 4, "do_sample": False, "pad_token_id": 0}
    greedy = decoder.generate(ids, **greedy_settings)
    assisted = decoder.generate(ids, assistant_model=decoder, **greedy_settings)
    assert torch.equal(assisted, greedy)


def test_generate_without_is_decoder_keeps_no_cache():
    """As transformers: a causal LM built without is_decoder generates (warning that it sees later tokens),
    with no cache made for it, not a refusal of the cache generate() would have built."""
    config = tiny_causal_config("full")
    config.is_decoder = False
    ids = left_padded_batch()[0][:1]
    model = EfficientBertForCausalLM(config).eval()
    out = model.generate(ids, max_new_tokens=2, do_sample=False, pad_token_id=0)
    assert out.shape == (1, ids.shape[1] + 2)


def test_decoder_refusals():
    """A cache belongs to decoders and must be ours; assisted decoding, which rolls a cache back, is refused
    for recurrent states; positions past the table raise before indexing it. (Without is_decoder the causal
    LM builds and use_cache is ignored, as in transformers: tests/models/text/test_upstream_contract.py.)"""
    encoder = EfficientBertModel(tiny_config("full"))
    ids, mask = left_padded_batch()
    with pytest.raises(ValueError, match="cache is for causal models"):
        encoder(ids, cache=EfficientBertForCausalLM(tiny_causal_config("full")).new_cache())
    decoder = EfficientBertForCausalLM(tiny_causal_config("linear")).eval()
    with pytest.raises(TypeError, match="cache must be an hf_efficient EfficientCache"):
        decoder(ids, cache=DynamicCache())
    assert decoder._is_stateful and not EfficientBertForCausalLM(tiny_causal_config("full"))._is_stateful
    # transformers up to 5.24 refuses a stateful model, 5.25 a cache that cannot be cropped
    with pytest.raises(ValueError, match="not supported with stateful models|cache that can be cropped"):
        decoder.generate(ids[:1], assistant_model=decoder, max_new_tokens=3, pad_token_id=0)
    short = EfficientBertForCausalLM(tiny_causal_config("linear", max_position_embeddings=12)).eval()
    with pytest.raises(
        ValueError, match=r"after 9 earlier tokens \(the cache\) but max_position_embeddings=12"
    ):
        short(ids[:, :4], cache=short(ids).cache)
    with pytest.raises(
        CONFIG_ERRORS, match="Causal attention types: full, linear, longformer, performer, rfa"
    ):
        tiny_config("reformer_lsh", is_decoder=True)


def test_encoder_checkpoint_warm_starts_a_decoder(tmp_path):
    """An MLM checkpoint loads as a causal LM with is_decoder=True (every weight but the gate RFA builds for
    its causal form), and a decoder's checkpoint, gate included, loads back into an encoder without unexpected
    keys: the gate is ignored where it is not built."""
    config = tiny_config("rfa", attention_config={"num_features": 16, "causal_chunk": 8})
    hf_efficient.EfficientBertForMaskedLM(config).save_pretrained(tmp_path / "mlm")
    decoder, info = EfficientBertForCausalLM.from_pretrained(
        tmp_path / "mlm", is_decoder=True, output_loading_info=True
    )
    assert sorted(info["missing_keys"]) == sorted(
        f"bert.encoder.layer.{i}.attention.self.core.{name}"
        for i in range(2)
        for name in ("gate_bias", "gate_weight")
    )
    assert not info["unexpected_keys"] and decoder.config.is_decoder
    decoder.save_pretrained(tmp_path / "clm")
    encoder, info = hf_efficient.EfficientBertForMaskedLM.from_pretrained(
        tmp_path / "clm", is_decoder=False, output_loading_info=True
    )
    assert not info["unexpected_keys"] and not info["missing_keys"]
    assert not any("gate" in name for name, _ in encoder.named_parameters())


# Loads each saved causal model (one folder per type) with AutoModelForCausalLM (remote code when asked) and
# saves its logits and tokens: one interpreter for every type.
LOAD_AND_GENERATE = """
import sys
import torch
from transformers import AutoModelForCausalLM

torch.set_num_threads(1)
inputs_path, out_path, trust, *folders = sys.argv[1:]
inputs = torch.load(inputs_path)
results = {}
for folder in folders:
    model = AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=trust == "trust").eval()
    with torch.no_grad():
        logits = model(**inputs).logits
    tokens = model.generate(**inputs, max_new_tokens=20, do_sample=False, pad_token_id=0)
    results[folder] = {"logits": logits, "tokens": tokens, "module": type(model).__module__}
imported = any(name.split(".")[0] == "hf_efficient" for name in sys.modules)
torch.save({"models": results, "imported": imported}, out_path)
"""


@pytest.mark.slow  # two fresh interpreters
def test_saved_causal_models_generate_identically_in_a_fresh_process(tmp_path):
    """Every causal type saved (registered for AutoModelForCausalLM, so the flat remote code is written), then
    loaded in fresh interpreters: one with hf_efficient installed, one through trust_remote_code where
    importing it fails. Logits are identical and greedy generation gives the same 20 tokens. One interpreter
    of each kind loads every type's folder (an interpreter per type started 10 processes for one check);
    a failure names its type."""
    ids, mask = left_padded_batch()
    torch.save({"input_ids": ids, "attention_mask": mask}, tmp_path / "inputs.pt")
    expected = {}
    for attention_type in CAUSAL_TYPES:
        model = EfficientBertForCausalLM(tiny_causal_config(attention_type)).eval()
        model.register_for_auto_class("AutoModelForCausalLM")
        folder = str(tmp_path / attention_type)  # the folder's name is its remote code's module name
        model.save_pretrained(folder)
        with torch.no_grad():
            logits = model(ids, attention_mask=mask).logits
        tokens = model.generate(ids, attention_mask=mask, max_new_tokens=20, do_sample=False, pad_token_id=0)
        expected[attention_type] = (folder, logits, tokens)
    folders = [folder for folder, _, _ in expected.values()]
    installed = "import hf_efficient\n" + LOAD_AND_GENERATE
    run_python(installed, tmp_path / "inputs.pt", tmp_path / "installed.pt", "no", *folders)
    run_python(
        BLOCK_HF_EFFICIENT + LOAD_AND_GENERATE,
        tmp_path / "inputs.pt",
        tmp_path / "remote.pt",
        "trust",
        *folders,
    )
    for name, imported in (("installed", True), ("remote", False)):
        result = torch.load(tmp_path / f"{name}.pt")
        assert result["imported"] is imported, name
        for attention_type, (folder, logits, tokens) in expected.items():
            got = result["models"][folder]
            where = f"{attention_type} ({name})"
            assert got["module"].startswith("hf_efficient" if imported else "transformers_modules"), where
            assert torch.equal(got["logits"], logits), where
            assert torch.equal(got["tokens"], tokens), where


@pytest.mark.parametrize("attention_type", CAUSAL_TYPES)
def test_bfloat16_decoding_keeps_recurrent_state_in_float32(attention_type):
    """A bfloat16 model decodes as its parallel form does (bfloat16 precision); running sums stay float32
    (they add up many tokens), keys and values are kept in the model's dtype."""
    model = EfficientBertForCausalLM(tiny_causal_config(attention_type)).eval().to(torch.bfloat16)
    ids, mask = left_padded_batch()
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        expected = model(ids, attention_mask=mask, position_ids=positions, use_cache=False).logits
    decoded, cache = decode_token_by_token(model, ids, mask, 3)
    real = mask.bool()
    torch.testing.assert_close(decoded[real].float(), expected[real].float(), atol=2e-2, rtol=2e-2)
    layer = cache.layers[0]
    kept = (
        layer.state[0] if isinstance(layer, hf_efficient.attention.cache.RecurrentStateLayer) else layer.keys
    )
    assert kept.dtype == (torch.float32 if kept is not getattr(layer, "keys", None) else torch.bfloat16)


def test_logits_to_keep_scores_only_the_last_positions():
    """generate() asks for the last position's logits only during the prompt (logits_to_keep=1)."""
    model = EfficientBertForCausalLM(tiny_causal_config("linear")).eval()
    ids, mask = left_padded_batch()
    with torch.no_grad():
        every = model(ids, attention_mask=mask).logits
        last = model(ids, attention_mask=mask, logits_to_keep=1).logits
        chosen = model(ids, attention_mask=mask, logits_to_keep=torch.tensor([0, 4])).logits
    assert last.shape == (2, 1, every.shape[-1])
    torch.testing.assert_close(last, every[:, -1:])
    torch.testing.assert_close(chosen, every[:, [0, 4]])
