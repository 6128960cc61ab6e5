"""EfficientBert (the text encoder) over every text attention type: heads, losses, padding, save/load, Auto
classes, parity with transformers' BERT, gradient checkpointing, per-layer types and clear errors.

Tiny models only (hidden 32, 2 layers, 4 heads, vocab 99, 64 positions: helpers.py), each attention type
with its ``small_config``. What every type must pass is in checks.py, run here per registered text type.
"""

from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F
from transformers import (
    AutoConfig,
    AutoModelForMaskedLM,
    BertConfig,
    BertForMaskedLM,
    BertForSequenceClassification,
    BertModel,
    GPT2Config,
    GPT2Model,
    ViTConfig,
    ViTModel,
)

import hf_efficient
from hf_efficient import (
    EfficientBertConfig,
    EfficientBertForMaskedLM,
    EfficientBertForSequenceClassification,
    EfficientBertModel,
)
from hf_efficient.training import resample_attention_random_state

from ...attention.helpers import small_config as small
from ..helpers import CONFIG_ERRORS, assert_same_gradients, enable_gradient_checkpointing, parameter_gradients
from . import checks
from .helpers import HEADS, HIDDEN, LAYERS, MAX_POS, TINY_BERT, VOCAB, assert_close_real, batch, tiny_config

TEXT_TYPES = hf_efficient.list_attention_types("text")
EFFICIENT_TYPES = [t for t in TEXT_TYPES if t != "full"]


# ---------------------------------------------------------------------------------------------------------
# Heads: shapes, losses, gradients
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("attention_type", TEXT_TYPES)
def test_masked_lm_shapes_loss_and_grads(attention_type):
    checks.check_masked_lm_shapes_loss_and_grads(attention_type)


def test_masked_lm_sparse_prediction_same_loss_and_gradients():
    """Every sparse_prediction setting trains on the same loss and gradients as BERT's dense head (False):
    None (the default) without any logits, True with the (M, V) logits of the masked positions; without
    labels (fill-mask) the logits stay (b, n, V)."""
    torch.manual_seed(0)
    no_dropout = dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    dense = EfficientBertForMaskedLM(tiny_config("full", **no_dropout, sparse_prediction=False)).train()
    ids, mask = batch()
    labels = ids.masked_fill(torch.rand(ids.shape) < 0.8, -100).masked_fill(mask == 0, -100)
    labels[0, 0] = ids[0, 0]
    n_masked = int((labels != -100).sum())
    out_dense = dense(ids, attention_mask=mask, labels=labels)
    assert out_dense.logits.shape == (3, 20, VOCAB)
    out_dense.loss.backward()
    for setting in (True, None):
        model = EfficientBertForMaskedLM(tiny_config("full", **no_dropout, sparse_prediction=setting))
        model.load_state_dict(dense.state_dict())
        out = model.train()(ids, attention_mask=mask, labels=labels)
        if setting:
            assert out.logits.shape == (n_masked, VOCAB)
            torch.testing.assert_close(out.logits, out_dense.logits[labels != -100])
        else:
            assert out.logits is None
        torch.testing.assert_close(out.loss, out_dense.loss, atol=1e-5, rtol=1e-5)
        out.loss.backward()
        for (name, p_dense), p in zip(dense.named_parameters(), model.parameters(), strict=True):
            torch.testing.assert_close(p.grad, p_dense.grad, atol=1e-5, rtol=1e-5, msg=f"{setting} {name}")
        assert model(ids, attention_mask=mask).logits.shape == (3, 20, VOCAB)


def test_masked_lm_training_keeps_no_vocabulary_sized_tensor():
    """With labels in training mode (the default sparse_prediction) autograd saves nothing with a
    vocabulary-sized dimension beyond the decoder's own (V, D) weight and its gradient: the n x V logits
    and the masked rows' log-softmax, which the dense head keeps for backward, are never built."""
    vocab, n = 4096, 64
    config = tiny_config("full", vocab_size=vocab, max_position_embeddings=n, hidden_dropout_prob=0.0)
    ids = torch.randint(5, vocab, (2, n))
    labels = ids.masked_fill(torch.rand(ids.shape) < 0.85, -100)

    def largest_saved_with_vocab(sparse_prediction):
        config.sparse_prediction = sparse_prediction
        model = EfficientBertForMaskedLM(config).train()
        sizes = []

        def pack(tensor):
            if vocab in tensor.shape and tensor.dim() >= 2 and tensor.shape[-1] != config.hidden_size:
                sizes.append(tensor.numel())
            return tensor

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            loss = model(ids, labels=labels).loss
        loss.backward()  # the gradients still flow
        assert model.bert.embeddings.word_embeddings.weight.grad.abs().sum() > 0
        return max(sizes, default=0)

    # the dense head saves the masked rows' log-softmax, (M, V) (the loss reads those rows only)
    assert largest_saved_with_vocab(False) >= int((labels != -100).sum()) * vocab
    assert largest_saved_with_vocab(None) == 0


def test_masked_lm_default_head_under_trainer(tmp_path):
    """Trainer trains the default head (no logits in training) and its evaluation hands compute_metrics
    BERT's (examples, n, V) logits next to the labels."""
    from datasets import Dataset
    from transformers import Trainer, TrainingArguments

    ids, mask = batch(b=4, lengths=[20, 20, 15, 9])
    labels = ids.masked_fill(torch.rand(ids.shape) < 0.7, -100).masked_fill(mask == 0, -100)
    labels[:, 0] = ids[:, 0]
    data = Dataset.from_dict(
        {"input_ids": ids.tolist(), "attention_mask": mask.tolist(), "labels": labels.tolist()}
    )
    seen = {}

    def compute_metrics(prediction):
        seen["logits"], seen["labels"] = prediction.predictions.shape, prediction.label_ids.shape
        scored = prediction.label_ids != -100
        return {
            "accuracy": float(
                (prediction.predictions.argmax(-1)[scored] == prediction.label_ids[scored]).mean()
            )
        }

    model = EfficientBertForMaskedLM(tiny_config("full"))
    args = TrainingArguments(
        tmp_path,
        max_steps=2,
        per_device_train_batch_size=2,
        per_device_eval_batch_size=2,
        report_to=[],
        use_cpu=True,
    )
    trainer = Trainer(model, args, train_dataset=data, eval_dataset=data, compute_metrics=compute_metrics)
    assert trainer.train().training_loss > 0
    metrics = trainer.evaluate()
    assert seen == {"logits": (4, 20, VOCAB), "labels": (4, 20)}
    assert metrics["eval_loss"] > 0 and 0 <= metrics["eval_accuracy"] <= 1


@pytest.mark.parametrize("attention_type", TEXT_TYPES)
def test_sequence_classification_problem_types(attention_type):
    checks.check_sequence_classification_problem_types(attention_type)


@pytest.mark.parametrize("attention_type", TEXT_TYPES)
def test_token_classification_shapes_loss_and_grads(attention_type):
    checks.check_token_classification_shapes_loss_and_grads(attention_type)


def test_problem_type_inference_matches_transformers(tmp_path):
    """The same labels give the same problem_type and loss as transformers' BertForSequenceClassification."""
    ids, mask = batch()
    cases = [
        (3, torch.tensor([0, 2, 1])),
        (3, torch.tensor([[1.0, 0.0, 1.0], [0.0, 0.0, 0.0], [0.0, 1.0, 1.0]])),
        (1, torch.tensor([0.5, -1.0, 2.0])),
        (2, torch.tensor([[0.5, -1.0], [2.0, 0.0], [1.0, 1.0]])),  # float labels, 2 outputs: multi-label
    ]
    for i, (num_labels, labels) in enumerate(cases):
        ref = BertForSequenceClassification(BertConfig(**TINY_BERT, num_labels=num_labels)).eval()
        ref.save_pretrained(tmp_path / str(i))
        ours = EfficientBertForSequenceClassification.from_pretrained(tmp_path / str(i)).eval()
        with torch.no_grad():
            expected = ref(ids, attention_mask=mask, labels=labels)
            got = ours(ids, attention_mask=mask, labels=labels)
        assert ours.config.problem_type == ref.config.problem_type
        torch.testing.assert_close(got.loss, expected.loss, atol=1e-5, rtol=1e-5)
    # int32 class ids count as single-label in transformers too, where cross-entropy then fails; ours casts.
    ours = EfficientBertForSequenceClassification(tiny_config(num_labels=3)).eval()
    labels = torch.tensor([0, 2, 1], dtype=torch.int32)
    out = ours(ids, attention_mask=mask, labels=labels)
    assert ours.config.problem_type == "single_label_classification"
    torch.testing.assert_close(out.loss, F.cross_entropy(out.logits, labels.long()))


# ---------------------------------------------------------------------------------------------------------
# Padding
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("attention_type", TEXT_TYPES)
def test_batch_rows_equal_unpadded_runs(attention_type):
    checks.check_batch_rows_equal_unpadded_runs(attention_type)


# ---------------------------------------------------------------------------------------------------------
# Save / load and the Auto classes
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("attention_type", TEXT_TYPES)
def test_save_load_identical_through_auto_classes(attention_type, tmp_path):
    checks.check_save_load_identical_through_auto_classes(attention_type, tmp_path)


def test_inputs_embeds_and_resize_token_embeddings(tmp_path):
    model = EfficientBertForMaskedLM(tiny_config("longformer")).eval()
    ids, mask = batch()
    with torch.no_grad():
        expected = model(ids, attention_mask=mask).logits
        embeds = model.get_input_embeddings()(ids)
        torch.testing.assert_close(model(inputs_embeds=embeds, attention_mask=mask).logits, expected)
    with pytest.raises(ValueError, match="exactly one of input_ids"):
        model(ids, inputs_embeds=embeds)
    model.resize_token_embeddings(VOCAB + 5)
    assert model.config.vocab_size == VOCAB + 5
    assert model.cls.predictions.decoder.weight is model.bert.embeddings.word_embeddings.weight
    assert model.cls.predictions.decoder.bias is model.cls.predictions.bias
    with torch.no_grad():
        resized = model(ids, attention_mask=mask).logits
    assert resized.shape == (3, 20, VOCAB + 5)
    torch.testing.assert_close(resized[..., :VOCAB], expected)  # old tokens score as before
    model.save_pretrained(tmp_path)
    with torch.no_grad():
        reloaded = EfficientBertForMaskedLM.from_pretrained(tmp_path).eval()(ids, attention_mask=mask).logits
    torch.testing.assert_close(reloaded, resized, atol=0, rtol=0)


def test_auto_config_for_model_type():
    config = AutoConfig.for_model("efficient_bert", attention_type="longformer", **TINY_BERT)
    assert type(config) is EfficientBertConfig and config.attention_type == "longformer"
    model = AutoModelForMaskedLM.from_config(config)
    assert type(model) is EfficientBertForMaskedLM


# ---------------------------------------------------------------------------------------------------------
# Parity with transformers' BERT
# ---------------------------------------------------------------------------------------------------------


def _randomise_zero_init(model: torch.nn.Module) -> None:
    """Give biases and LayerNorms non-trivial values, so a parameter that fails to load shows."""
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("bias") or "LayerNorm" in name:
                param.add_(0.1 * torch.randn_like(param))


@pytest.mark.parametrize(
    "ref_class, our_class",
    [
        (BertModel, EfficientBertModel),
        (BertForMaskedLM, EfficientBertForMaskedLM),
        (BertForSequenceClassification, EfficientBertForSequenceClassification),
    ],
)
def test_parity_with_transformers_bert(ref_class, our_class, tmp_path):
    ref = ref_class(BertConfig(**TINY_BERT, num_labels=3)).eval()
    _randomise_zero_init(ref)
    ref.save_pretrained(tmp_path)
    ours, info = our_class.from_pretrained(tmp_path, attention_type="full", output_loading_info=True)
    ours.eval()
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    assert ours.config.model_type == "efficient_bert"
    ids, mask = batch()
    token_types = (torch.arange(20) >= 10).long().expand(3, -1)
    kwargs = dict(attention_mask=mask, token_type_ids=token_types, output_hidden_states=True)
    if ref_class is BertForSequenceClassification:
        kwargs["labels"] = torch.tensor([0, 2, 1])
    with torch.no_grad():
        expected = ref(ids, **kwargs)
        got = ours(ids, **kwargs)
    assert set(expected.keys()) == set(got.keys())
    close = dict(atol=1e-5, rtol=1e-5)
    for field in expected.keys():
        if field == "hidden_states":
            assert len(got.hidden_states) == len(expected.hidden_states) == LAYERS + 1
            for ours_h, ref_h in zip(got.hidden_states, expected.hidden_states, strict=True):
                assert_close_real(ours_h, ref_h, mask, **close)
        elif expected[field].shape[:2] == mask.shape:  # per-token outputs
            assert_close_real(got[field], expected[field], mask, **close)
        else:  # pooled outputs, sequence logits, losses
            torch.testing.assert_close(got[field], expected[field], **close, msg=field)


def test_bert_base_checkpoint_loads_into_task_models(tmp_path):
    """A BertModel checkpoint (no ``bert.`` prefix, legacy position_ids buffer) fills ``model.bert``."""
    from safetensors.torch import load_file, save_file

    ref = BertModel(BertConfig(**TINY_BERT)).eval()
    _randomise_zero_init(ref)
    ref.save_pretrained(tmp_path)
    weights = load_file(tmp_path / "model.safetensors")
    weights["embeddings.position_ids"] = torch.arange(MAX_POS)[None]  # as in bert-base-uncased, MiniLM
    save_file(weights, tmp_path / "model.safetensors", metadata={"format": "pt"})
    ids, mask = batch()
    with torch.no_grad():
        expected = ref(ids, attention_mask=mask)
    for model_class in (EfficientBertForMaskedLM, EfficientBertForSequenceClassification):
        model, info = model_class.from_pretrained(tmp_path, output_loading_info=True)
        assert info["unexpected_keys"] <= {"pooler.dense.weight", "pooler.dense.bias"}, info  # MLM: no pooler
        assert all(not key.startswith("bert.") for key in info["missing_keys"]), info  # only the head is new
        with torch.no_grad():
            got = model.eval().bert(ids, attention_mask=mask)
        assert_close_real(got.last_hidden_state, expected.last_hidden_state, mask, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("attention_type", EFFICIENT_TYPES)
def test_bert_checkpoint_warm_starts_efficient_types(attention_type, tmp_path):
    checks.check_bert_checkpoint_warm_starts(attention_type, tmp_path)


def kernels_used(model, ids, mask) -> list[str]:
    """The exact-softmax kernel each core ran with in one forward (read from the inputs it was given)."""
    seen = []
    hooks = [
        core.register_forward_pre_hook(lambda core, args: seen.append(core.attn_implementation(args[3])))
        for core in model.attention_cores()
    ]
    with torch.no_grad():
        model(ids, attention_mask=mask)
    for hook in hooks:
        hook.remove()
    return seen


def test_eager_and_sdpa_agree(tmp_path):
    ref = BertModel(BertConfig(**TINY_BERT)).eval()
    _randomise_zero_init(ref)
    ref.save_pretrained(tmp_path)
    ids, mask = batch()
    sdpa = EfficientBertModel.from_pretrained(tmp_path).eval()
    eager = EfficientBertModel.from_pretrained(tmp_path, attn_implementation="eager").eval()
    assert sdpa.config._attn_implementation == "sdpa"
    assert eager.config._attn_implementation == "eager"
    with torch.no_grad():
        expected = ref(ids, attention_mask=mask).last_hidden_state
        out_sdpa = sdpa(ids, attention_mask=mask).last_hidden_state
        out_eager = eager(ids, attention_mask=mask).last_hidden_state
    assert kernels_used(eager, ids, mask) == ["eager"] * TINY_BERT["num_hidden_layers"]
    torch.testing.assert_close(out_eager, out_sdpa, atol=1e-5, rtol=1e-5)
    assert_close_real(out_eager, expected, mask, atol=1e-5, rtol=1e-5)

    specs = [core.spec for core in sdpa.attention_cores()]
    sdpa.set_attn_implementation("eager")
    with torch.no_grad():
        switched = sdpa(ids, attention_mask=mask).last_hidden_state
    assert kernels_used(sdpa, ids, mask) == ["eager"] * TINY_BERT["num_hidden_layers"]
    assert [core.spec for core in sdpa.attention_cores()] == specs  # the switch changed no model state
    torch.testing.assert_close(switched, out_sdpa, atol=1e-5, rtol=1e-5)
    sdpa.set_attn_implementation("sdpa")
    with torch.no_grad():
        sdpa(ids, attention_mask=mask)
    assert all(core.spec.attn_implementation == "sdpa" for core in sdpa.attention_cores())


# ---------------------------------------------------------------------------------------------------------
# Gradient checkpointing, attentions, hidden states
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("attention_type", ["full", "longformer", "performer", "linformer", "reformer_lsh"])
def test_gradient_checkpointing_same_gradients(attention_type):
    config = tiny_config(attention_type, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    model = EfficientBertForMaskedLM(config).train()
    ids, mask = batch()

    def loss():
        return model(ids, attention_mask=mask, labels=ids.masked_fill(mask == 0, -100)).loss

    plain = parameter_gradients(model, loss)
    assert plain.keys() == dict(model.named_parameters()).keys()  # every parameter gets a gradient
    enabled = [
        lambda: enable_gradient_checkpointing(model),  # non-reentrant torch.utils.checkpoint
        lambda: model.activation_checkpointing_enable({"use_reentrant": True}),
    ]
    for enable in enabled:
        enable()
        assert all(layer.gradient_checkpointing for layer in model.bert.encoder.layer)
        assert_same_gradients(parameter_gradients(model, loss), plain)
        model.activation_checkpointing_disable()
        assert not any(layer.gradient_checkpointing for layer in model.bert.encoder.layer)


@pytest.mark.parametrize("attention_type", ["longformer", "performer", "linear", "reformer_lsh"])
def test_attention_checkpointing_same_gradients_fewer_saved(attention_type):
    """Checkpointing the cores gives the same gradients (dropout inside the core included: its RNG state is
    replayed) and keeps less for backward."""
    model = EfficientBertForMaskedLM(tiny_config(attention_type, hidden_dropout_prob=0.0)).train()
    ids, mask = batch()

    def loss():
        torch.manual_seed(0)  # the same dropout masks in both runs
        return model(ids, attention_mask=mask, labels=ids.masked_fill(mask == 0, -100)).loss

    def saved_elements():
        sizes = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: sizes.append(t.numel()) or t, lambda t: t):
            loss().backward()
        model.zero_grad()
        return sum(sizes)

    plain, plain_saved = parameter_gradients(model, loss), saved_elements()
    model.attention_checkpointing_enable()
    assert all(attention.checkpoint_core for attention in model.bert.encoder.layer.self_attentions())
    assert_same_gradients(parameter_gradients(model, loss), plain)
    assert saved_elements() < plain_saved
    model.attention_checkpointing_disable()
    assert saved_elements() == plain_saved


def test_output_attentions_and_hidden_states_like_transformers(tmp_path):
    ref = BertModel(BertConfig(**TINY_BERT)).eval()
    ref.save_pretrained(tmp_path)
    ours = EfficientBertModel.from_pretrained(tmp_path).eval()
    ref.set_attn_implementation("eager")  # transformers' sdpa kernel returns no weights
    ids, mask = batch()
    with torch.no_grad():
        expected = ref(ids, attention_mask=mask, output_attentions=True, output_hidden_states=True)
        got = ours(ids, attention_mask=mask, output_attentions=True, output_hidden_states=True)
        plain = ours(ids, attention_mask=mask)
    assert len(got.attentions) == LAYERS
    assert len(got.hidden_states) == LAYERS + 1
    for weights, ref_weights in zip(got.attentions, expected.attentions, strict=True):
        assert weights.shape == (3, HEADS, 20, 20)
        torch.testing.assert_close(weights.sum(-1), torch.ones(3, HEADS, 20))
        assert (weights[1, :, :, 13:] == 0).all(), "padded keys get no weight"
        # Padded query rows see other hidden states than transformers' from layer 2 on (assert_close_real).
        real_queries = mask.bool()[:, None, :, None].expand_as(weights)
        torch.testing.assert_close(weights[real_queries], ref_weights[real_queries], atol=1e-5, rtol=1e-5)
    for hidden, ref_hidden in zip(got.hidden_states, expected.hidden_states, strict=True):
        assert_close_real(hidden, ref_hidden, mask, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got.hidden_states[-1], got.last_hidden_state)
    assert plain.attentions is None and plain.hidden_states is None
    # Tuple outputs as in transformers.
    as_tuple = ours(ids, attention_mask=mask, return_dict=False)
    assert isinstance(as_tuple, tuple)
    torch.testing.assert_close(as_tuple[0], plain.last_hidden_state)


@pytest.mark.parametrize("attention_type", TEXT_TYPES)
def test_output_attentions_or_a_clear_error(attention_type):
    checks.check_output_attentions_or_a_clear_error(attention_type)


def test_model_builds_inputs_once_for_every_layer():
    """The model hands every core the same prepared AttentionInputs object; the specs never change."""
    model = EfficientBertModel(tiny_config(num_hidden_layers=3)).eval()
    specs = [core.spec for core in model.attention_cores()]
    seen = []
    for core in model.attention_cores():
        core.register_forward_pre_hook(lambda core, args: seen.append(args[3]))
    model(torch.randint(0, VOCAB, (2, 9)), attention_mask=torch.tensor([[1] * 9, [1] * 6 + [0] * 3]))
    assert len(seen) == 3 and all(inputs is seen[0] for inputs in seen)
    assert seen[0].prepared_for == (2, 9) and seen[0].attention_mask.dtype == torch.bool
    assert [core.spec for core in model.attention_cores()] == specs


# ---------------------------------------------------------------------------------------------------------
# Per-layer attention types
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "overrides, expected_types",
    [
        (  # default type is longformer; the last layer is exact
            dict(attention_type="longformer", layer_attention_types=["longformer", "full"]),
            ["longformer", "full"],
        ),
        (  # default type is full; the other layer's hyperparameters are in layer_attention_configs
            dict(
                attention_type="full",
                attention_config=None,
                layer_attention_types=["performer", "full"],
                layer_attention_configs={"performer": {"num_features": 16, "block_size": 4}},
            ),
            ["performer", "full"],
        ),
        (
            dict(
                attention_type="linformer",
                layer_attention_types=["bigbird", "linformer"],
                layer_attention_configs={"bigbird": small("bigbird")},
            ),
            ["bigbird", "linformer"],
        ),
    ],
)
def test_per_layer_attention_types(overrides, expected_types, tmp_path):
    config = tiny_config(**overrides)
    model = EfficientBertForMaskedLM(config).eval()
    assert [core.attention_type for core in model.attention_cores()] == expected_types
    if "performer" in expected_types:
        assert model.attention_cores()[0].config.num_features == 16
    ids, mask = batch()
    with torch.no_grad():
        expected = model(ids, attention_mask=mask).logits
    model.save_pretrained(tmp_path)
    loaded = AutoModelForMaskedLM.from_pretrained(tmp_path).eval()
    assert loaded.config.layer_attention_types == expected_types
    assert [core.attention_type for core in loaded.attention_cores()] == expected_types
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids, attention_mask=mask).logits, expected, atol=0, rtol=0)


def test_per_layer_attention_types_invalid():
    with pytest.raises(CONFIG_ERRORS, match="one type per layer"):
        tiny_config("full", layer_attention_types=["full", "full", "full"])
    with pytest.raises(CONFIG_ERRORS, match="Unknown attention_type 'not_a_type'"):
        tiny_config("full", layer_attention_types=["full", "not_a_type"])
    with pytest.raises(CONFIG_ERRORS, match="no layer uses"):
        tiny_config(
            "full",
            layer_attention_types=["longformer", "full"],
            layer_attention_configs={"longformer": small("longformer"), "performer": {}},
        )
    with pytest.raises(CONFIG_ERRORS, match="belong in attention_config"):
        tiny_config("full", layer_attention_types=["full", "full"], layer_attention_configs={"full": {}})
    with pytest.raises(CONFIG_ERRORS, match="Valid keys"):
        tiny_config(
            "full",
            layer_attention_types=["longformer", "full"],
            layer_attention_configs={"longformer": {"x": 1}},
        )
    with pytest.raises(CONFIG_ERRORS, match="not available for text"):
        tiny_config("full", layer_attention_types=["graph_sparse", "full"])


# ---------------------------------------------------------------------------------------------------------
# Attention-specific state: Linformer layerwise sharing, random features
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "tie_word_embeddings, layer_attention_types",
    [(True, None), (False, None), (True, ["full", "linformer", "linformer"])],
    ids=["tied", "untied_embeddings", "per_layer_types"],
)
def test_linformer_layerwise_sharing_survives_save_load(tie_word_embeddings, layer_attention_types, tmp_path):
    config = tiny_config(
        "linformer",
        attention_config={"projected_length": 8, "sharing": "layerwise"},
        tie_word_embeddings=tie_word_embeddings,
        layer_attention_types=layer_attention_types,
        num_hidden_layers=len(layer_attention_types or [None] * LAYERS),
    )

    def linformer_cores(model):
        return [core for core in model.attention_cores() if core.attention_type == "linformer"]

    model = EfficientBertForMaskedLM(config).eval()
    first, second = linformer_cores(model)
    assert first.projection is second.projection
    ids, mask = batch()
    with torch.no_grad():
        expected = model(ids, attention_mask=mask).logits
    model.save_pretrained(tmp_path)
    loaded, info = EfficientBertForMaskedLM.from_pretrained(tmp_path, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info  # saved once, tied on load
    loaded.eval()
    first, second = linformer_cores(loaded)
    assert first.projection is second.projection
    names = [name for name, _ in loaded.named_parameters() if name.endswith("core.projection")]
    assert len(names) == 1, names  # one Parameter, counted once
    torch.testing.assert_close(first.projection, linformer_cores(model)[0].projection, atol=0, rtol=0)
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids, attention_mask=mask).logits, expected, atol=0, rtol=0)
    # Training updates the one shared matrix, which receives the gradients of both layers.
    loaded.train()
    loaded(ids, attention_mask=mask, labels=ids).loss.backward()
    assert first.projection.grad is not None and first.projection.grad.abs().sum() > 0


@pytest.mark.parametrize("attention_type", ["performer", "rfa"])
def test_resample_random_state_is_seeded(attention_type):
    config = tiny_config(attention_type)
    model = EfficientBertModel(config).eval()
    twin = EfficientBertModel(config).eval()
    twin.load_state_dict(model.state_dict())
    ids, mask = batch()

    def encode(m):
        with torch.no_grad():
            return m(ids, attention_mask=mask).last_hidden_state

    before = encode(model)
    torch.testing.assert_close(encode(twin), before, atol=0, rtol=0)
    assert resample_attention_random_state(model, seed=1) == LAYERS
    after = encode(model)
    assert (after - before).abs().max() > 1e-4, "a redraw must change the outputs"
    assert torch.isfinite(after).all()
    torch.manual_seed(1234)  # the global RNG plays no part
    resample_attention_random_state(twin, seed=1)
    torch.testing.assert_close(encode(twin), after, atol=0, rtol=0)
    resample_attention_random_state(twin, seed=2)
    assert (encode(twin) - after).abs().max() > 1e-4


# ---------------------------------------------------------------------------------------------------------
# Position embeddings: too-long inputs, resizing
# ---------------------------------------------------------------------------------------------------------


def test_input_longer_than_positions_raises():
    model = EfficientBertModel(tiny_config("longformer")).eval()
    ids = torch.randint(5, VOCAB, (1, MAX_POS + 1))
    with pytest.raises(ValueError, match=r"max_position_embeddings=64.*resize_position_embeddings"):
        model(ids)


@pytest.mark.parametrize("model_class", [EfficientBertModel, EfficientBertForMaskedLM])
@pytest.mark.parametrize("attention_type", ["full", "longformer", "performer"])
def test_resize_position_embeddings(model_class, attention_type, tmp_path):
    model = model_class(tiny_config(attention_type)).eval()
    base = model.base_model
    old_table = base.embeddings.position_embeddings.weight.detach().clone()
    ids, mask = batch()
    with torch.no_grad():
        before = model(ids, attention_mask=mask)[0]
    model.resize_position_embeddings(150)
    table = base.embeddings.position_embeddings.weight
    assert table.shape == (150, HIDDEN) and table.requires_grad
    assert model.config.max_position_embeddings == 150
    # The learned table is copied: rows [64, 128) and [128, 150) repeat rows [0, 64) and [0, 22).
    torch.testing.assert_close(table[:64], old_table, atol=0, rtol=0)
    torch.testing.assert_close(table[64:128], old_table, atol=0, rtol=0)
    torch.testing.assert_close(table[128:], old_table[:22], atol=0, rtol=0)
    with torch.no_grad():
        # Inputs that fitted before give the same outputs as before.
        torch.testing.assert_close(model(ids, attention_mask=mask)[0], before, atol=0, rtol=0)
        long_ids = torch.randint(5, VOCAB, (2, 150))
        long_out = model(long_ids)[0]
        prefix_out = model(long_ids[:, :MAX_POS])[0]
    assert long_out.shape[:2] == (2, 150) and torch.isfinite(long_out).all()
    # A longer input is not its old-length prefix plus more: every attention type here lets the first
    # positions see the later tokens (bidirectional; Longformer through its global token 0).
    assert (long_out[:, :MAX_POS] - prefix_out).abs().max() > 1e-5  # float noise is ~1e-7
    with pytest.raises(ValueError, match="must exceed"):
        model.resize_position_embeddings(100)
    # The new length is saved.
    model.save_pretrained(tmp_path)
    loaded = model_class.from_pretrained(tmp_path).eval()
    assert loaded.config.max_position_embeddings == 150
    with torch.no_grad():
        torch.testing.assert_close(loaded(long_ids)[0], long_out, atol=0, rtol=0)


def test_resize_position_embeddings_linformer_needs_reinitialisation():
    model = EfficientBertForMaskedLM(tiny_config("linformer")).eval()
    with pytest.raises(ValueError, match="reinitialize_fixed_length_attention=True"):
        model.resize_position_embeddings(128)
    assert model.config.max_position_embeddings == MAX_POS  # nothing changed
    assert model.bert.embeddings.position_embeddings.num_embeddings == MAX_POS
    model.resize_position_embeddings(128, reinitialize_fixed_length_attention=True)
    assert all(core.max_seq_len == 128 for core in model.attention_cores())
    assert all(core.key_projection.shape[-1] == 128 for core in model.attention_cores())
    with torch.no_grad():
        out = model(torch.randint(5, VOCAB, (1, 128))).logits
    assert out.shape == (1, 128, VOCAB) and torch.isfinite(out).all()


# ---------------------------------------------------------------------------------------------------------
# Clear errors
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "make_foreign",
    [
        lambda: ViTModel(
            ViTConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=37)
        ),
        lambda: GPT2Model(GPT2Config(n_embd=32, n_layer=1, n_head=4, vocab_size=VOCAB, n_positions=64)),
    ],
    ids=["vit", "gpt2"],
)
def test_checkpoint_of_another_architecture_raises(make_foreign, tmp_path):
    foreign = make_foreign()
    foreign.save_pretrained(tmp_path)
    with pytest.raises(ValueError, match=f"model_type '{foreign.config.model_type}' cannot be mapped"):
        EfficientBertForMaskedLM.from_pretrained(tmp_path)
    with pytest.raises(ValueError, match="cannot be mapped"):
        EfficientBertConfig.from_pretrained(tmp_path)


def test_graph_only_attention_type_raises_for_text():
    with pytest.raises(CONFIG_ERRORS, match="not available for text") as excinfo:
        tiny_config("graph_sparse", attention_config=None)
    for text_type in TEXT_TYPES:
        assert text_type in str(excinfo.value)


def test_unknown_attention_type_and_config_key_raise():
    with pytest.raises(CONFIG_ERRORS, match="Unknown attention_type 'flash_magic'.*Registered types"):
        tiny_config("flash_magic", attention_config=None)
    with pytest.raises(CONFIG_ERRORS, match=r"Unknown attention_config key\(s\) \['window'\].*Valid keys"):
        tiny_config("longformer", attention_config={"window": 8})


def test_attention_overrides_in_from_pretrained_are_validated(tmp_path):
    BertModel(BertConfig(**TINY_BERT)).save_pretrained(tmp_path)
    with pytest.raises(CONFIG_ERRORS, match="Valid keys"):
        EfficientBertModel.from_pretrained(
            tmp_path, attention_type="longformer", attention_config={"window": 8}
        )
    with pytest.raises(CONFIG_ERRORS, match="not available for text"):
        EfficientBertModel.from_pretrained(tmp_path, attention_type="graph_sparse")
    with pytest.raises(CONFIG_ERRORS, match="one type per layer"):
        EfficientBertModel.from_pretrained(tmp_path, layer_attention_types=["full"])


def test_unsupported_bert_options_raise(tmp_path):
    # relative positions need a type that forms the scores (tests/models/text/test_relative_positions.py)
    with pytest.raises(CONFIG_ERRORS, match="position_embedding_type='relative_key': .*'linear' cannot add"):
        tiny_config("linear", position_embedding_type="relative_key")
    BertModel(BertConfig(**TINY_BERT)).save_pretrained(tmp_path)
    config_file = tmp_path / "config.json"
    config_file.write_text(
        config_file.read_text().replace("{", '{"position_embedding_type": "relative_key",', 1)
    )
    with pytest.raises(CONFIG_ERRORS, match="relative_key.*'performer' cannot add relative position scores"):
        EfficientBertModel.from_pretrained(tmp_path, attention_type="performer")
    with pytest.raises(CONFIG_ERRORS, match="add_cross_attention=True needs is_decoder=True"):
        tiny_config(add_cross_attention=True)
    # a decoder needs a causal form in every layer; the error lists the types that have one
    assert tiny_config("linear", is_decoder=True).is_decoder
    with pytest.raises(CONFIG_ERRORS, match=r"\['bigbird'\] has none\. Causal attention types: full, linear"):
        tiny_config("bigbird", is_decoder=True)
    with pytest.raises(CONFIG_ERRORS, match=r"\['nystromformer'\] has none"):
        tiny_config("full", is_decoder=True, layer_attention_types=["full", "nystromformer"])


def test_global_attention_mask_only_for_types_that_take_it():
    ids, mask = batch()
    global_mask = torch.zeros_like(mask)
    global_mask[:, 3] = 1
    model = EfficientBertModel(tiny_config("longformer")).eval()
    with torch.no_grad():
        plain = model(ids, attention_mask=mask).last_hidden_state
        with_global = model(ids, attention_mask=mask, global_attention_mask=global_mask).last_hidden_state
    assert (with_global - plain).abs().max() > 1e-4
    performer = EfficientBertModel(tiny_config("performer")).eval()
    with pytest.raises(ValueError, match="global_attention_mask"):
        performer(ids, attention_mask=mask, global_attention_mask=global_mask)
