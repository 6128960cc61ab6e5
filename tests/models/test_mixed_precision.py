"""Mixed precision as users train: every model class and head x every attention type it takes x
{autocast bfloat16, autocast float16, the model cast to bfloat16}, and Trainer's ``--bf16 --use_cpu``.

Each case runs a training step on a tiny model (dropout off): the loss is finite and within a stated
tolerance of the same model's float32 loss, and every parameter's gradient is finite. The tolerances are
loose enough for half precision's rounding through two layers (bfloat16 keeps 8 bits of mantissa, float16
11) and far tighter than a broken path: a wrong cast or a loss computed on garbage moves it by whole units.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch

from hf_efficient import (
    EfficientBertForCausalLM,
    EfficientBertForMaskedLM,
    EfficientBertForMultipleChoice,
    EfficientBertForNextSentencePrediction,
    EfficientBertForPreTraining,
    EfficientBertForSequenceClassification,
    EfficientBertForTokenClassification,
    EfficientGraphForGraphClassification,
    EfficientGraphForNodeClassification,
    EfficientViTForImageClassification,
    EfficientViTForMaskedImageModeling,
    EfficientViTMAEForPreTraining,
    GraphCollator,
    causal_attention_types,
    get_attention_class,
    list_attention_types,
)

from .graph.helpers import attention_type_config, base_records
from .text.helpers import tiny_causal_config
from .text.helpers import tiny_config as tiny_text_config
from .vision.helpers import images, mae_noise
from .vision.helpers import tiny_config as tiny_vision_config

NO_DROPOUT = dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
# |loss - float32 loss| <= atol + rtol * |float32 loss|
TOLERANCE = {torch.bfloat16: (0.05, 0.05), torch.float16: (0.01, 0.01)}


@dataclass(frozen=True)
class Head:
    """A model class with one of its heads: how to build it for a type, and a batch with labels."""

    types: Callable[[], list[str]]
    build: Callable[[str], torch.nn.Module]
    batch: Callable[[torch.nn.Module], dict]


def _text_batch(causal=False, token_labels=False, sequence_labels=False, next_sentence=False, choices=0):
    """Two sequences of 24 tokens (the second padded) and their labels; ``next_sentence``: BERT
    pretraining's two labels; ``choices``: the multiple-choice head's (1, choices, 24) inputs and label."""

    def batch(model):
        g = torch.Generator().manual_seed(0)
        ids = torch.randint(5, model.config.vocab_size, (2, 24), generator=g)
        mask = torch.ones(2, 24, dtype=torch.long)
        mask[1, 18:] = 0
        if choices:
            return {"input_ids": ids[None], "attention_mask": mask[None], "labels": torch.tensor([1])}
        if sequence_labels:
            labels = torch.tensor([0, 1])
        elif token_labels:
            labels = torch.randint(0, 3, (2, 24), generator=g).masked_fill(mask == 0, -100)
        else:  # language modelling: a target at every other real token (a causal LM shifts them itself)
            labels = ids.masked_fill(mask == 0, -100)
            if not causal:
                labels[:, ::2] = -100
        inputs = {"input_ids": ids, "attention_mask": mask, "labels": labels}
        return {**inputs, "next_sentence_label": torch.tensor([1, 0])} if next_sentence else inputs

    return batch


def _graph_batch(level):
    def batch(model):
        records = base_records()
        if level == "node":
            records = [{**r, "y": [i % 2 for i in range(r["num_nodes"])]} for r in records]
        return GraphCollator.for_config(model.config, label_level=level)(records)

    return batch


def _vision_types(masked: bool) -> list[str]:
    # MAE's encoder sees a random subset of patches: no patch grid for window attention there
    types = list_attention_types("vision")
    return [t for t in types if not (masked and get_attention_class(t).capabilities.patch_grid)]


HEADS = {
    "masked_lm": Head(
        lambda: list_attention_types("text"),
        lambda t: EfficientBertForMaskedLM(tiny_text_config(t, **NO_DROPOUT)),
        _text_batch(),
    ),
    "causal_lm": Head(
        lambda: causal_attention_types("text"),
        lambda t: EfficientBertForCausalLM(tiny_causal_config(t, **NO_DROPOUT)),
        _text_batch(causal=True),
    ),
    "sequence_classification": Head(
        lambda: list_attention_types("text"),
        lambda t: EfficientBertForSequenceClassification(tiny_text_config(t, num_labels=2, **NO_DROPOUT)),
        _text_batch(sequence_labels=True),
    ),
    "token_classification": Head(
        lambda: list_attention_types("text"),
        lambda t: EfficientBertForTokenClassification(tiny_text_config(t, num_labels=3, **NO_DROPOUT)),
        _text_batch(token_labels=True),
    ),
    # BERT's and ViT's other heads: the encoders above under another head, on a few types
    "pretraining": Head(
        lambda: ["full", "performer"],
        lambda t: EfficientBertForPreTraining(tiny_text_config(t, **NO_DROPOUT)),
        _text_batch(next_sentence=True),
    ),
    "next_sentence_prediction": Head(
        lambda: ["full", "longformer"],
        lambda t: EfficientBertForNextSentencePrediction(tiny_text_config(t, **NO_DROPOUT)),
        _text_batch(sequence_labels=True),
    ),
    "multiple_choice": Head(
        lambda: ["full", "linear"],
        lambda t: EfficientBertForMultipleChoice(tiny_text_config(t, **NO_DROPOUT)),
        _text_batch(choices=2),
    ),
    "masked_image_modeling": Head(
        lambda: ["full", "swin_window"],
        lambda t: EfficientViTForMaskedImageModeling(tiny_vision_config(t, encoder_stride=4, **NO_DROPOUT)),
        lambda model: {"pixel_values": images(), "bool_masked_pos": torch.arange(16).expand(2, -1) % 3 == 0},
    ),
    "image_classification": Head(
        lambda: _vision_types(masked=False),
        lambda t: EfficientViTForImageClassification(tiny_vision_config(t, num_labels=3, **NO_DROPOUT)),
        lambda model: {"pixel_values": images(), "labels": torch.tensor([0, 2])},
    ),
    "mae_pretraining": Head(
        lambda: _vision_types(masked=True),
        lambda t: EfficientViTMAEForPreTraining(tiny_vision_config(t, **NO_DROPOUT)),
        lambda model: {"pixel_values": images(), "noise": mae_noise()},
    ),
    "graph_classification": Head(
        lambda: list_attention_types("graph"),
        lambda t: EfficientGraphForGraphClassification(attention_type_config(t, "transformer")),
        _graph_batch("graph"),
    ),
    "node_classification": Head(
        lambda: list_attention_types("graph"),
        lambda t: EfficientGraphForNodeClassification(attention_type_config(t, "transformer")),
        _graph_batch("node"),
    ),
}
CASES = [(head, t) for head, spec in HEADS.items() for t in spec.types()]
# Trainer's --bf16 is autocast bfloat16 around the step, the same maths for every type: each type's bfloat16
# step is test_training_step_in_mixed_precision[autocast_bf16]; what the Trainer adds (its autocast context,
# the optimiser step on a head's loss and parameters) is the head's, checked once per head on its first type.
TRAINER_CASES = [(head, spec.types()[0]) for head, spec in HEADS.items()]
MODES = {
    "autocast_bf16": (torch.bfloat16, False),
    "autocast_fp16": (torch.float16, False),
    "model_bf16": (torch.bfloat16, True),
}
# The edit loop (`make test-fast`) runs every head x type under autocast bfloat16 (the Trainer's --bf16) and
# every mode on each head's first type; the other types' float16 autocast and bfloat16 cast are `slow` (make
# test): their cores' half-precision arithmetic, cast and autocast, bfloat16 and float16, is
# tests/attention/test_half_precision.py's in the fast loop, and what the model around a core adds is the
# head's, which its first type checks. The Trainer runs once per modality there (the other heads: make test).
FAST_MODE = "autocast_bf16"
FAST_TRAINER_HEADS = ("masked_lm", "image_classification", "graph_classification")
STEP_CASES = [
    pytest.param(
        head, t, mode, marks=() if mode == FAST_MODE or t == HEADS[head].types()[0] else pytest.mark.slow
    )
    for head, t in CASES
    for mode in MODES
]
TRAINER_PARAMS = [
    pytest.param(head, t, marks=() if head in FAST_TRAINER_HEADS else pytest.mark.slow)
    for head, t in TRAINER_CASES
]


def _loss(model, batch) -> torch.Tensor:
    torch.manual_seed(0)  # training-time random state (LSH rotations, feature redraws) as in the float32 run
    return model(**batch).loss


def _float_inputs_as(batch: dict, dtype) -> dict:
    return {k: v.to(dtype) if torch.is_tensor(v) and v.is_floating_point() else v for k, v in batch.items()}


@pytest.mark.parametrize(("head", "attention_type", "mode"), STEP_CASES)
def test_training_step_in_mixed_precision(head, attention_type, mode):
    spec, (dtype, cast_model) = HEADS[head], MODES[mode]
    torch.manual_seed(0)
    model = spec.build(attention_type).train()
    batch = spec.batch(model)
    with torch.no_grad():
        reference = _loss(model, batch).item()
    half = copy.deepcopy(model)
    if cast_model:
        half = half.to(dtype)
        loss = _loss(half, _float_inputs_as(batch, dtype))
    else:
        with torch.autocast("cpu", dtype=dtype):
            loss = _loss(half, batch)
    loss.backward()
    atol, rtol = TOLERANCE[dtype]
    assert torch.isfinite(loss), f"{mode}: loss {loss}"
    assert abs(loss.item() - reference) <= atol + rtol * abs(reference), (loss.item(), reference)
    for name, param in half.named_parameters():
        if param.requires_grad:  # MAE's sin-cos position table is fixed
            assert param.grad is not None, f"{name} received no gradient"
            assert torch.isfinite(param.grad).all(), f"{mode}: {name} has a non-finite gradient"


@pytest.mark.parametrize(("head", "attention_type"), TRAINER_PARAMS)
def test_trainer_bf16_on_cpu(head, attention_type, tmp_path):
    """``Trainer`` with ``--bf16 --use_cpu`` (autocast bfloat16 around each step): one optimiser step whose
    loss is the float32 loss within bfloat16's tolerance, and parameters that stay finite. Once per head (its
    first type): the other head x type pairs' bfloat16 maths under autocast is
    test_training_step_in_mixed_precision[<head>-<type>-autocast_bf16], which the Trainer path only wraps."""
    from transformers import Trainer, TrainingArguments

    spec = HEADS[head]
    torch.manual_seed(0)
    model = spec.build(attention_type).train()
    batch = spec.batch(model)
    with torch.no_grad():
        reference = _loss(model, batch).item()
    args = TrainingArguments(
        output_dir=str(tmp_path),
        bf16=True,
        use_cpu=True,
        max_steps=1,
        per_device_train_batch_size=1,
        save_strategy="no",
        report_to=[],
        disable_tqdm=True,
        seed=0,
    )
    collate = lambda items: items[0]  # noqa: E731 - the dataset holds whole batches
    trainer = Trainer(model=model, args=args, train_dataset=[batch], data_collator=collate)
    loss = trainer.train().training_loss
    atol, rtol = TOLERANCE[torch.bfloat16]
    assert abs(loss - reference) <= atol + rtol * abs(reference), (loss, reference)
    for name, param in model.named_parameters():
        assert torch.isfinite(param).all(), f"{name} is not finite after the step"
