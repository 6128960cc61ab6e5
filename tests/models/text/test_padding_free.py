"""Padding-free text encoders: a padded batch computed on its real tokens only gives every real token the
padded computation's outputs and gradients, for every text attention type and every head."""

from __future__ import annotations

import pytest
import torch

import hf_efficient
from hf_efficient import EfficientBertForMaskedLM, EfficientBertForSequenceClassification

from .helpers import assert_close_real, batch, tiny_config

TEXT_TYPES = hf_efficient.list_attention_types("text")
CLOSE = dict(atol=1e-5, rtol=1e-5)


def left_padded(ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The same rows with their padding moved to the left."""
    order = torch.argsort(mask, dim=1, stable=True)  # padding first, then the real tokens in order
    return ids.gather(1, order), mask.gather(1, order)


@pytest.mark.parametrize("attention_type", TEXT_TYPES)
def test_padding_free_equals_padded(attention_type):
    """Masked-LM logits and the encoder's hidden states at every real token, the loss and the gradients of
    every parameter equal the padded computation's (1e-5); rows of one real token and rows of none too."""
    ids, mask = batch(b=4, n=20, lengths=(20, 13, 1, 0))
    labels = ids.masked_fill((torch.arange(20) % 3 != 0)[None] | (mask == 0), -100)
    torch.manual_seed(0)
    padded = EfficientBertForMaskedLM(tiny_config(attention_type, sparse_prediction=False)).eval()
    free = EfficientBertForMaskedLM(tiny_config(attention_type, sparse_prediction=False, padding_free=True))
    free.load_state_dict(padded.state_dict())
    outputs = []
    for model in (padded, free.eval()):
        out = model(ids, attention_mask=mask, labels=labels, output_hidden_states=True)
        out.loss.backward()
        outputs.append(out)
    assert_close_real(outputs[1].logits, outputs[0].logits, mask, **CLOSE)
    for got, expected in zip(outputs[1].hidden_states, outputs[0].hidden_states, strict=True):
        assert_close_real(got, expected, mask, **CLOSE)
    torch.testing.assert_close(outputs[1].loss, outputs[0].loss, **CLOSE)
    grads = dict(padded.named_parameters())
    for name, param in free.named_parameters():
        if grads[name].grad is not None:
            torch.testing.assert_close(param.grad, grads[name].grad, atol=1e-5, rtol=1e-4, msg=name)


@pytest.mark.parametrize("attention_type", ["full", "longformer", "linear"])
def test_padding_free_heads(attention_type):
    """The pooled head reads the same [CLS] either way."""
    ids, mask = batch()
    torch.manual_seed(0)
    padded = EfficientBertForSequenceClassification(tiny_config(attention_type)).eval()
    free = EfficientBertForSequenceClassification(tiny_config(attention_type, padding_free=True)).eval()
    free.load_state_dict(padded.state_dict())
    torch.testing.assert_close(
        free(ids, attention_mask=mask).logits, padded(ids, attention_mask=mask).logits, **CLOSE
    )


def test_padding_free_masked_lm_head_reads_the_real_tokens_only(monkeypatch):
    """Without labels (inference: (b, n, V) logits) the vocabulary projection, as costly as the encoder at
    BERT's sizes, runs on the real tokens only, chunk by chunk (chunks of 4 here), and the logits equal the
    padded head's at every real token (zeros at padding); a batch without padding runs the head whole."""
    monkeypatch.setattr(hf_efficient.models.text.tasks.MaskedLMTask, "REAL_TOKEN_CHUNK", 4)
    ids, mask = batch()
    torch.manual_seed(0)
    padded = EfficientBertForMaskedLM(tiny_config("longformer")).eval()
    free = EfficientBertForMaskedLM(tiny_config("longformer", padding_free=True)).eval()
    free.load_state_dict(padded.state_dict())
    rows = []
    decoder = free.get_output_embeddings()
    decoder.register_forward_hook(lambda module, args, out: rows.append(args[0].shape[:-1].numel()))
    with torch.no_grad():
        logits = free(ids, attention_mask=mask).logits
        expected = padded(ids, attention_mask=mask).logits
    real = int(mask.sum())
    assert sum(rows) == real and max(rows) == 4  # not b * n = 60 rows
    assert_close_real(logits, expected, mask, **CLOSE)
    assert not logits[mask == 0].any()
    rows.clear()
    with torch.no_grad():
        free(ids, attention_mask=torch.ones_like(mask))
    assert rows == [ids.numel()]


# A full row's real tokens run on into the next row's: runs [0, 33) and [60, 67); [0, 45) and [60, 80).
@pytest.mark.parametrize("lengths, chunks", [((20, 13, 0, 7), 5 + 1), ((20, 20, 5, 20), 6 + 3)])
def test_padding_free_masked_lm_head_writes_into_the_logits(monkeypatch, lengths, chunks):
    """Under no_grad, with nothing attached to the decoder, each chunk of real rows is projected straight
    into its rows of the (b, n, V) output (no (chunk, V) tensor beside it): the padded head's logits at every
    real token, zeros at padding; with autograd the decoder module runs, and the gradients are the padded
    head's."""
    monkeypatch.setattr(hf_efficient.models.text.tasks.MaskedLMTask, "REAL_TOKEN_CHUNK", 8)
    ids, mask = batch(b=4, lengths=lengths)
    torch.manual_seed(0)
    padded = EfficientBertForMaskedLM(tiny_config("longformer")).eval()
    free = EfficientBertForMaskedLM(tiny_config("longformer", padding_free=True)).eval()
    free.load_state_dict(padded.state_dict())
    addmm, outs = torch.addmm, []

    def counted(*args, out=None, **kwargs):
        outs.append(out)
        return addmm(*args, out=out, **kwargs)

    with torch.no_grad():
        expected = padded(ids, attention_mask=mask).logits
        monkeypatch.setattr(torch, "addmm", counted)
        logits = free(ids, attention_mask=mask).logits
        monkeypatch.setattr(torch, "addmm", addmm)
    assert len(outs) == chunks  # chunks of 8 rows
    assert {out.untyped_storage().data_ptr() for out in outs} == {logits.untyped_storage().data_ptr()}
    assert_close_real(logits, expected, mask, **CLOSE)
    assert not logits[mask == 0].any()
    grads = []
    for model in (padded, free):
        model.zero_grad()
        model(ids, attention_mask=mask).logits[mask.bool()].square().sum().backward()
        grads.append(model.get_output_embeddings().weight.grad)
    torch.testing.assert_close(grads[1], grads[0], **CLOSE)


def test_masked_lm_eval_loss_reads_the_masked_rows_only(monkeypatch):
    """An evaluation step (eval mode, labels: (b, n, V) logits returned) takes the loss's log-softmax over
    the masked positions only, not over every one of the b x n rows (padding and unmasked tokens, whose
    labels are -100): the same loss as over every row, padded or padding-free."""
    ids, mask = batch()
    labels = torch.full_like(ids, -100)
    labels[:, 1], labels[0, 5] = ids[:, 1], ids[0, 5]  # 4 masked positions of b x n = 60
    rows = []
    cross_entropy = torch.nn.functional.cross_entropy

    def counted(logits, target, *args, **kwargs):
        rows.append(logits.shape[0])
        return cross_entropy(logits, target, *args, **kwargs)

    monkeypatch.setattr(hf_efficient.modeling.heads.F, "cross_entropy", counted)
    for padding_free in (False, True):
        torch.manual_seed(0)
        model = EfficientBertForMaskedLM(tiny_config("longformer", padding_free=padding_free)).eval()
        with torch.no_grad():
            out = model(ids, attention_mask=mask, labels=labels)
        assert rows.pop() == 4 and out.logits.shape[:2] == ids.shape
        every_row = cross_entropy(out.logits.flatten(0, 1), labels.flatten())  # ignore_index=-100
        torch.testing.assert_close(out.loss, every_row)


def test_only_right_padded_batches_run_padding_free(monkeypatch):
    """A left-padded batch (and one with gaps) runs padded: the same outputs, no stream."""
    ids, mask = batch()
    streams = []
    original = hf_efficient.models.text.encoder.EfficientTextModel._forward_unpadded
    monkeypatch.setattr(
        hf_efficient.models.text.encoder.EfficientTextModel,
        "_forward_unpadded",
        lambda self, stream, *args: streams.append(stream) or original(self, stream, *args),
    )
    model = EfficientBertForMaskedLM(tiny_config("longformer", padding_free=True)).eval()
    model(ids, attention_mask=mask)
    assert len(streams) == 1 and streams[0].num_tokens == int(mask.sum())
    model(*left_padded(ids, mask))
    gapped = mask.clone()
    gapped[0, 5] = 0
    model(ids, attention_mask=gapped)
    assert len(streams) == 1


@pytest.mark.parametrize("attention_type", TEXT_TYPES)
def test_packed_row_equals_each_sequence_alone(attention_type):
    """A row of packed sequences (DataCollatorWithFlattening's: position_ids restarting at 0) gives every
    sequence its masked-LM logits alone; a decoder's causal LM too, where the type has a causal form."""
    from transformers import DataCollatorWithFlattening

    lengths = (11, 4, 17)
    ids, _ = batch(b=3, n=17, lengths=lengths)
    examples = [{"input_ids": ids[i, :length].tolist()} for i, length in enumerate(lengths)]
    packed = DataCollatorWithFlattening(return_tensors="pt")(examples)
    assert packed["input_ids"].shape == (1, sum(lengths))
    causal = attention_type in hf_efficient.causal_attention_types("text")
    configs = [tiny_config(attention_type)]
    if causal:
        from .helpers import tiny_causal_config

        configs.append(tiny_causal_config(attention_type))
    for config in configs:
        torch.manual_seed(0)
        model_class = (
            EfficientBertForMaskedLM if not config.is_decoder else hf_efficient.EfficientBertForCausalLM
        )
        model = model_class(config).eval()
        together = model(packed["input_ids"], position_ids=packed["position_ids"]).logits[0]
        start = 0
        for i, length in enumerate(lengths):
            alone = model(ids[i : i + 1, :length]).logits[0]
            torch.testing.assert_close(together[start : start + length], alone, **CLOSE)
            start += length
