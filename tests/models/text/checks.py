"""What every text attention type must do inside EfficientBert, as plain checks on a type's name: the heads'
shapes, losses and gradients, padding, save/load through the Auto classes, attention weights or a clear
error, and warm-starting from a BERT checkpoint.

tests/models/text/test_modeling.py parametrises them over ``list_attention_types("text")``; a test that
registers a mechanism of its own runs them all with :func:`check_text_encoder`.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
import torch
from torch.nn import functional as F
from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForCausalLM,
    AutoModelForMaskedLM,
    AutoModelForSequenceClassification,
    AutoModelForTokenClassification,
    BertConfig,
    BertForMaskedLM,
)

from hf_efficient import (
    EfficientBertConfig,
    EfficientBertForCausalLM,
    EfficientBertForMaskedLM,
    EfficientBertForSequenceClassification,
    EfficientBertForTokenClassification,
    EfficientBertModel,
    get_attention_class,
)

from ...attention.helpers import small_config
from ..helpers import assert_grads_finite, check_export_matches
from .helpers import (
    HEADS,
    LAYERS,
    LENGTHS,
    TINY_BERT,
    VOCAB,
    batch,
    decode_token_by_token,
    greedy_without_cache,
    left_padded_batch,
    tiny_causal_config,
    tiny_config,
)


def check_masked_lm_shapes_loss_and_grads(attention_type: str) -> None:
    """Training with labels builds no vocabulary-sized logits (logits None, a finite loss with gradients);
    in eval mode the logits are BERT's (b, n, V) and the loss is their cross-entropy."""
    model = EfficientBertForMaskedLM(tiny_config(attention_type)).train()
    ids, mask = batch()
    labels = ids.masked_fill(torch.rand(ids.shape) < 0.7, -100).masked_fill(mask == 0, -100)
    labels[0, 0] = ids[0, 0]  # at least one target
    out = model(ids, attention_mask=mask, labels=labels)
    assert out.logits is None
    assert out.loss.ndim == 0 and torch.isfinite(out.loss)
    out.loss.backward()
    assert_grads_finite(model)
    assert model.bert.embeddings.word_embeddings.weight.grad.abs().sum() > 0
    # The decoder is tied to the word embeddings (BERT's tie_word_embeddings=True).
    assert model.cls.predictions.decoder.weight is model.bert.embeddings.word_embeddings.weight
    with torch.no_grad():
        out = model.eval()(ids, attention_mask=mask, labels=labels)
    assert out.logits.shape == (3, 20, VOCAB)
    expected = F.cross_entropy(out.logits.reshape(-1, VOCAB), labels.reshape(-1), ignore_index=-100)
    torch.testing.assert_close(out.loss, expected)


def check_sequence_classification_problem_types(attention_type: str) -> None:
    ids, mask = batch()
    # Single label: integer labels and num_labels > 1.
    model = EfficientBertForSequenceClassification(tiny_config(attention_type, num_labels=3)).train()
    assert model.config.problem_type is None
    labels = torch.tensor([0, 2, 1])
    out = model(ids, attention_mask=mask, labels=labels)
    assert out.logits.shape == (3, 3)
    assert model.config.problem_type == "single_label_classification"
    torch.testing.assert_close(out.loss, F.cross_entropy(out.logits, labels))
    out.loss.backward()
    assert_grads_finite(model)
    assert model.bert.embeddings.word_embeddings.weight.grad.abs().sum() > 0

    # Multi label: float (b, num_labels) labels.
    model = EfficientBertForSequenceClassification(tiny_config(attention_type, num_labels=3)).eval()
    labels = torch.tensor([[1.0, 0.0, 1.0], [0.0, 0.0, 0.0], [0.0, 1.0, 1.0]])
    out = model(ids, attention_mask=mask, labels=labels)
    assert model.config.problem_type == "multi_label_classification"
    torch.testing.assert_close(out.loss, F.binary_cross_entropy_with_logits(out.logits, labels))

    # Regression: num_labels == 1, whatever the label dtype.
    model = EfficientBertForSequenceClassification(tiny_config(attention_type, num_labels=1)).eval()
    labels = torch.tensor([0.5, -1.0, 2.0])
    out = model(ids, attention_mask=mask, labels=labels)
    assert out.logits.shape == (3, 1)
    assert model.config.problem_type == "regression"
    torch.testing.assert_close(out.loss, F.mse_loss(out.logits.squeeze(-1), labels))


def check_token_classification_shapes_loss_and_grads(attention_type: str) -> None:
    model = EfficientBertForTokenClassification(tiny_config(attention_type, num_labels=5)).train()
    ids, mask = batch()
    labels = torch.randint(0, 5, ids.shape).masked_fill(mask == 0, -100)
    out = model(ids, attention_mask=mask, labels=labels)
    assert out.logits.shape == (3, 20, 5)
    expected = F.cross_entropy(out.logits.reshape(-1, 5), labels.reshape(-1), ignore_index=-100)
    torch.testing.assert_close(out.loss, expected)
    out.loss.backward()
    assert_grads_finite(model)
    assert model.bert.embeddings.word_embeddings.weight.grad.abs().sum() > 0


def check_batch_rows_equal_unpadded_runs(attention_type: str) -> None:
    """Each row of a padded batch equals that sequence encoded alone, without padding: the random token ids
    under mask 0 move no real token's output (the model's padding invariance; the cores', with poisoned pads,
    is the attention contract's)."""
    model = EfficientBertForMaskedLM(tiny_config(attention_type)).eval()
    ids, mask = batch()
    with torch.no_grad():
        together = model(ids, attention_mask=mask).logits
        for row, length in enumerate(LENGTHS):
            alone = model(ids[row : row + 1, :length]).logits
            torch.testing.assert_close(together[row : row + 1, :length], alone, atol=1e-5, rtol=1e-5)


def check_fully_padded_row(attention_type: str) -> None:
    """A row with no real token (batching real data yields one) in every head: finite logits, losses and
    gradients with that row's labels all -100, the other rows as without it; a batch with no target at all
    has loss 0, not NaN."""
    ids, mask = batch()
    mask[1] = 0  # row 1: all padding
    keep = [0, 2]
    labels = ids.masked_fill(mask == 0, -100)
    heads = [
        (EfficientBertForMaskedLM, {}, labels),
        (EfficientBertForSequenceClassification, {"num_labels": 3}, torch.tensor([0, -100, 2])),
        (EfficientBertForTokenClassification, {"num_labels": 3}, (labels % 3).masked_fill(mask == 0, -100)),
    ]
    for model_class, sizes, head_labels in heads:
        model = model_class(tiny_config(attention_type, **sizes)).eval()
        out = model(ids, attention_mask=mask, labels=head_labels)
        assert torch.isfinite(out.logits).all() and torch.isfinite(out.loss), model_class.__name__
        out.loss.backward()
        assert_grads_finite(model)
        with torch.no_grad():
            alone = model(ids[keep], attention_mask=mask[keep]).logits
        torch.testing.assert_close(out.logits[keep], alone, atol=1e-5, rtol=1e-5)
        no_target = model(ids, attention_mask=mask, labels=torch.full_like(head_labels, -100)).loss
        assert no_target.item() == 0.0, model_class.__name__


def check_save_load_identical_through_auto_classes(attention_type: str, folder: Path) -> None:
    ids, mask = batch()
    mlm = EfficientBertForMaskedLM(tiny_config(attention_type)).eval()
    with torch.no_grad():
        mlm.cls.predictions.bias.normal_()  # a trained, non-zero decoder bias must survive loading
        expected = mlm(ids, attention_mask=mask).logits
        expected_hidden = mlm.bert(ids, attention_mask=mask).last_hidden_state
    mlm.save_pretrained(folder / "mlm")

    config = AutoConfig.from_pretrained(folder / "mlm")
    assert type(config) is EfficientBertConfig
    assert config.attention_type == attention_type
    assert config.attention_config == small_config(attention_type)

    for loader in (EfficientBertForMaskedLM, AutoModelForMaskedLM):
        loaded = loader.from_pretrained(folder / "mlm").eval()
        assert type(loaded) is EfficientBertForMaskedLM
        with torch.no_grad():
            torch.testing.assert_close(loaded(ids, attention_mask=mask).logits, expected, atol=0, rtol=0)
        assert loaded.cls.predictions.decoder.weight is loaded.bert.embeddings.word_embeddings.weight

    # An MLM checkpoint also opens as the bare encoder.
    base = AutoModel.from_pretrained(folder / "mlm").eval()
    assert type(base) is EfficientBertModel
    with torch.no_grad():
        torch.testing.assert_close(base(ids, attention_mask=mask).last_hidden_state, expected_hidden)

    tasks = [
        (EfficientBertForSequenceClassification, AutoModelForSequenceClassification, "logits"),
        (EfficientBertForTokenClassification, AutoModelForTokenClassification, "logits"),
        (EfficientBertModel, AutoModel, "last_hidden_state"),
    ]
    for model_class, auto_class, field in tasks:
        model = model_class(tiny_config(attention_type, num_labels=4)).eval()
        task_folder = folder / model_class.__name__
        model.save_pretrained(task_folder)
        loaded = auto_class.from_pretrained(task_folder).eval()
        assert type(loaded) is model_class
        with torch.no_grad():
            torch.testing.assert_close(
                getattr(loaded(ids, attention_mask=mask), field),
                getattr(model(ids, attention_mask=mask), field),
                atol=0,
                rtol=0,
            )


def check_output_attentions_or_a_clear_error(attention_type: str) -> None:
    """Weights (b, heads, n, n) summing to 1 over real keys where the core can return them; elsewhere
    output_attentions=True raises, and hidden states still come back."""
    model = EfficientBertModel(tiny_config(attention_type)).eval()
    ids, mask = batch()
    if get_attention_class(attention_type).capabilities.output_attentions:
        attentions = model(ids, attention_mask=mask, output_attentions=True).attentions
        assert len(attentions) == LAYERS and attentions[0].shape == (3, HEADS, 20, 20)
        torch.testing.assert_close(attentions[0].sum(-1), torch.ones(3, HEADS, 20))
    else:
        with pytest.raises(ValueError, match="output_attentions=False"):
            model(ids, attention_mask=mask, output_attentions=True)
    hidden = model(ids, attention_mask=mask, output_hidden_states=True).hidden_states
    assert len(hidden) == LAYERS + 1


def check_bert_checkpoint_warm_starts(attention_type: str, folder: Path) -> None:
    """Every BERT weight loads; only the attention core's own parameters (if any) are new."""
    ref = BertForMaskedLM(BertConfig(**TINY_BERT)).eval()
    ref.save_pretrained(folder)
    ours, info = EfficientBertForMaskedLM.from_pretrained(
        folder,
        attention_type=attention_type,
        attention_config=small_config(attention_type),
        output_loading_info=True,
    )
    assert ours.config.attention_type == attention_type
    assert all(".attention.self.core." in key for key in info["missing_keys"]), info["missing_keys"]
    assert not info["mismatched_keys"]
    reference = dict(ref.named_parameters())
    for name, param in ours.named_parameters():
        if ".core." not in name:
            torch.testing.assert_close(param, reference[name], atol=0, rtol=0, msg=name)
    ids, mask = batch()
    with torch.no_grad():
        assert torch.isfinite(ours.eval()(ids, attention_mask=mask).logits).all()


def check_exports(attention_type: str, folder: Path) -> None:
    """A sequence classifier exports (torch.export and ONNX) and matches the model at unseen sizes. One layer:
    no text type's core differs between layers, and each further layer was the same trace again (the trace
    and the ONNX conversion take time in proportion to the layers)."""
    model = EfficientBertForSequenceClassification(tiny_config(attention_type, num_hidden_layers=1))
    check_export_matches(model, folder)


def check_text_encoder(attention_type: str, folder: Path | None = None) -> None:
    """Every check above on ``attention_type``; ``folder``: where checkpoints go (a temporary one if None)."""
    if folder is None:
        with tempfile.TemporaryDirectory() as tmp:
            return check_text_encoder(attention_type, Path(tmp))
    check_masked_lm_shapes_loss_and_grads(attention_type)
    check_sequence_classification_problem_types(attention_type)
    check_token_classification_shapes_loss_and_grads(attention_type)
    check_batch_rows_equal_unpadded_runs(attention_type)
    check_fully_padded_row(attention_type)
    check_save_load_identical_through_auto_classes(attention_type, Path(folder) / "auto")
    check_output_attentions_or_a_clear_error(attention_type)
    check_bert_checkpoint_warm_starts(attention_type, Path(folder) / "bert")
    if get_attention_class(attention_type).capabilities.causal:
        check_causal_lm(attention_type, Path(folder) / "causal")


# ---- causal language models (the types with a causal form: hf_efficient.causal_attention_types("text")) ----
PROMPT, DECODE_STEPS = 10, 200


def check_causal_lm_loss_and_grads(attention_type: str) -> None:
    """Next-token loss (labels = the inputs, shifted inside; -100 at padding), no cache while training with
    labels, a finite gradient for every parameter (RFA's gate included: a decoder uses it), tied decoder.
    Training with labels fuses the decoder with the loss (no logits); eval mode returns the logits."""
    model = EfficientBertForCausalLM(tiny_causal_config(attention_type)).train()
    ids, mask = batch()
    labels = ids.masked_fill(mask == 0, -100)
    out = model(ids, attention_mask=mask, labels=labels, output_hidden_states=True)
    assert out.logits is None and out.cache is None
    logits = model.cls.predictions(out.hidden_states[-1])  # (b, n, V) of the same forward
    expected = F.cross_entropy(
        logits[:, :-1].reshape(-1, VOCAB), labels[:, 1:].reshape(-1), ignore_index=-100
    )
    torch.testing.assert_close(out.loss, expected)
    with torch.no_grad():
        evaluated = model.eval()(ids, attention_mask=mask, labels=labels)
    assert evaluated.logits.shape == (3, 20, VOCAB)
    model.train()
    out.loss.backward()
    assert_grads_finite(model)
    assert model.cls.predictions.decoder.weight is model.bert.embeddings.word_embeddings.weight


def check_causal_lm_decoding_matches_parallel(attention_type: str) -> None:
    """The parallel causal forward equals token-by-token decoding from the cache over 200 steps (float32,
    1e-5): a 10-token prompt, then one token per call with generate()'s inputs (the mask of every token so
    far, position ids counted over real tokens); row 0 padded on the left, row 1 on the right (its last 30
    steps are padding, which must leave the state as it is)."""
    model = EfficientBertForCausalLM(tiny_causal_config(attention_type)).eval()
    n = PROMPT + DECODE_STEPS
    ids, _ = batch(b=2, n=n, lengths=(n, n), seed=3)
    mask = torch.ones(2, n, dtype=torch.long)
    mask[0, :6] = 0
    mask[1, -30:] = 0
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        expected = model(ids, attention_mask=mask, position_ids=positions, use_cache=False).logits
    decoded, cache = decode_token_by_token(model, ids, mask, PROMPT)
    real = mask.bool()
    torch.testing.assert_close(decoded[real], expected[real], atol=1e-5, rtol=1e-5)
    assert cache.get_seq_length() == n


def check_generate_features(attention_type: str) -> None:
    """generate() through the cache: greedy equals greedy recomputed without a cache on prompts of different
    lengths (left padding), max_new_tokens counts new tokens, a finished row (eos) is padded while the other
    goes on, beam search with the cache (reordered every step) equals beam search without one, and sampling
    is reproducible from a seed."""
    model = EfficientBertForCausalLM(tiny_causal_config(attention_type)).eval()
    ids, mask = left_padded_batch()
    greedy = model.generate(ids, attention_mask=mask, max_new_tokens=12, do_sample=False, pad_token_id=0)
    assert greedy.shape == (2, 9 + 12)
    assert torch.equal(greedy, greedy_without_cache(model, ids, mask, 12))

    eos = int(greedy[0, 9 + 3])  # row 0's fourth new token ends it
    stopped = model.generate(
        ids, attention_mask=mask, max_new_tokens=12, do_sample=False, pad_token_id=0, eos_token_id=eos
    )
    first_eos = (greedy[0, 9:] == eos).nonzero()[0, 0]
    assert torch.equal(stopped[0, : 9 + first_eos + 1], greedy[0, : 9 + first_eos + 1])
    assert (stopped[0, 9 + first_eos + 1 :] == 0).all()
    row1_eos = (greedy[1, 9:] == eos).nonzero()
    row1_end = 9 + (int(row1_eos[0, 0]) + 1 if len(row1_eos) else 12)
    assert torch.equal(stopped[1, :row1_end], greedy[1, :row1_end])

    beams = dict(max_new_tokens=6, num_beams=3, num_return_sequences=2, do_sample=False, pad_token_id=0)
    with_cache = model.generate(ids, attention_mask=mask, **beams)
    assert with_cache.shape == (4, 9 + 6)
    assert torch.equal(with_cache, model.generate(ids, attention_mask=mask, use_cache=False, **beams))

    samples = []
    for _ in range(2):
        torch.manual_seed(7)
        samples.append(
            model.generate(
                ids, attention_mask=mask, max_new_tokens=8, do_sample=True, top_k=10, pad_token_id=0
            )
        )
    assert torch.equal(*samples) and samples[0].shape == (2, 9 + 8)


def check_causal_save_load_through_auto_classes(attention_type: str, folder: Path) -> None:
    """A saved causal model opens with AutoModelForCausalLM as the same model: identical logits and greedy
    tokens; the same checkpoint also opens as the bare encoder."""
    model = EfficientBertForCausalLM(tiny_causal_config(attention_type)).eval()
    ids, mask = left_padded_batch()
    with torch.no_grad():
        expected = model(ids, attention_mask=mask).logits
    tokens = model.generate(ids, attention_mask=mask, max_new_tokens=5, do_sample=False, pad_token_id=0)
    model.save_pretrained(folder)
    loaded = AutoModelForCausalLM.from_pretrained(folder).eval()
    assert type(loaded) is EfficientBertForCausalLM and loaded.config.is_decoder
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids, attention_mask=mask).logits, expected, atol=0, rtol=0)
    assert torch.equal(
        loaded.generate(ids, attention_mask=mask, max_new_tokens=5, do_sample=False, pad_token_id=0), tokens
    )
    assert type(AutoModel.from_pretrained(folder)) is EfficientBertModel


def check_causal_lm(attention_type: str, folder: Path | None = None) -> None:
    """Every causal check above on ``attention_type`` (a type with a causal form)."""
    if folder is None:
        with tempfile.TemporaryDirectory() as tmp:
            return check_causal_lm(attention_type, Path(tmp))
    check_causal_lm_loss_and_grads(attention_type)
    check_causal_lm_decoding_matches_parallel(attention_type)
    check_generate_features(attention_type)
    check_causal_save_load_through_auto_classes(attention_type, Path(folder) / "causal")
