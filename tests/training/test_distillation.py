"""Attention distillation: the loss, the trainer around a frozen teacher, and scripts/distill_attention.py.

A tiny exact-attention EfficientBert (hidden 32, 2 layers) and a WordPiece vocabulary are saved to a temporary
folder as the teacher checkpoint; the students are the same checkpoint with Performer attention.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch
from datasets import Dataset
from transformers import BertTokenizer, TrainingArguments

from hf_efficient import EfficientBertConfig, EfficientBertForSequenceClassification, EfficientBertModel
from hf_efficient.training import AttentionDistillationTrainer, layer_relative_errors

from ..models.text.helpers import WORDS, write_vocab
from ..script_loader import QUIET

PERFORMER = {"attention_type": "performer", "attention_config": {"num_features": 16}}
COMMON = [*QUIET, "--dataloader_pin_memory", "false", "--use_cpu", "true"]


@pytest.fixture(scope="module")
def teacher_dir(tmp_path_factory) -> Path:
    """A tiny exact-attention checkpoint (no dropout) with its tokenizer: the teacher of every test.

    Weights drawn with std 0.2, not BERT's 0.02: at 0.02 the queries and keys are so small that softmax is
    nearly uniform and Performer matches it to 1e-8, leaving nothing to distil.
    """
    path = tmp_path_factory.mktemp("teacher")
    tokenizer = BertTokenizer(vocab=str(write_vocab(path, word_pieces=False)))
    tokenizer.save_pretrained(path)
    config = EfficientBertConfig(
        vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=64, max_position_embeddings=64, hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0, initializer_range=0.2,
    )  # fmt: skip
    torch.manual_seed(0)
    EfficientBertModel(config).save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def teacher(teacher_dir) -> EfficientBertModel:
    return EfficientBertModel.from_pretrained(teacher_dir)


def batch(seed: int = 0, b: int = 4, n: int = 12, pad: int = 0) -> dict[str, torch.Tensor]:
    """Random token ids (b, n + pad); the last ``pad`` positions of every row are padding."""
    g = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(5, 5 + len(WORDS), (b, n + pad), generator=g)  # (b, n + pad)
    attention_mask = torch.ones(b, n + pad, dtype=torch.long)  # (b, n + pad)
    attention_mask[:, n:] = 0
    return {"input_ids": input_ids, "attention_mask": attention_mask}


def trainer_for(student, teacher, tmp_path, dataset=None, **args) -> AttentionDistillationTrainer:
    training_args = TrainingArguments(
        output_dir=str(tmp_path), report_to="none", use_cpu=True, save_strategy="no", seed=0, **args
    )
    return AttentionDistillationTrainer(
        model=student, teacher=teacher, args=training_args, train_dataset=dataset
    )


def test_loss_is_zero_for_the_teachers_attention_and_positive_for_performer(teacher_dir, teacher, tmp_path):
    same = EfficientBertModel.from_pretrained(teacher_dir).eval()
    trainer = trainer_for(same, teacher, tmp_path)
    assert trainer.compute_loss(same, batch()).item() == pytest.approx(0.0, abs=1e-10)
    performer = EfficientBertModel.from_pretrained(teacher_dir, **PERFORMER).eval()
    loss = trainer.compute_loss(performer, batch())
    assert 0.01 < loss.item() < 10 and loss.ndim == 0


def test_padding_does_not_count(teacher_dir, teacher, tmp_path):
    student = EfficientBertModel.from_pretrained(teacher_dir, **PERFORMER).eval()
    trainer = trainer_for(student, teacher, tmp_path)
    unpadded = trainer.compute_loss(student, batch(n=12))
    padded = batch(n=12, pad=7)
    padded["input_ids"][:, :12] = batch(n=12)["input_ids"]
    assert trainer.compute_loss(student, padded).item() == pytest.approx(unpadded.item(), rel=1e-5)
    # The loss itself ignores padded positions whatever they hold: poison them.
    with torch.no_grad():
        teacher_hidden = teacher(**padded, output_hidden_states=True).hidden_states
        student_hidden = student(**padded, output_hidden_states=True).hidden_states
    poisoned = [h.clone() for h in student_hidden]
    for h in poisoned:
        h[:, 12:] = float("inf")
    errors = layer_relative_errors(student_hidden, teacher_hidden, padded["attention_mask"])
    assert errors.shape == (2,) and torch.isfinite(errors).all()
    assert torch.equal(layer_relative_errors(poisoned, teacher_hidden, padded["attention_mask"]), errors)
    # Relative error: scaling both by the same factor leaves each layer's error unchanged.
    scaled = layer_relative_errors([10 * h for h in student_hidden], [10 * h for h in teacher_hidden])
    assert torch.allclose(scaled, layer_relative_errors(student_hidden, teacher_hidden), rtol=1e-5)


def test_training_lowers_the_loss_and_leaves_the_teacher_alone(teacher_dir, teacher, tmp_path):
    student = EfficientBertModel.from_pretrained(teacher_dir, **PERFORMER)
    fixed = batch(seed=1, b=8)
    rows = Dataset.from_dict({k: v.tolist() for k, v in fixed.items()})
    teacher_before = {k: v.clone() for k, v in teacher.state_dict().items()}
    trainer = trainer_for(
        student, teacher, tmp_path, rows, max_steps=15, learning_rate=3e-3, per_device_train_batch_size=8,
        logging_steps=5, lr_scheduler_type="constant",
    )  # fmt: skip
    before = trainer.compute_loss(student.eval(), fixed).item()
    trainer.train()
    after = trainer.compute_loss(student.eval(), fixed).item()
    assert after < 0.7 * before
    assert all(torch.equal(v, teacher_before[k]) for k, v in teacher.state_dict().items())
    assert all(p.grad is None and not p.requires_grad for p in teacher.parameters())
    assert not teacher.training
    optimised = {id(p) for group in trainer.optimizer.param_groups for p in group["params"]}
    assert optimised.isdisjoint(id(p) for p in teacher.parameters())
    logs = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert len(logs) == 3 and {"layer_1_relative_error", "layer_2_relative_error"} <= set(logs[0])
    # The logged loss is the plain mean of the layers' errors (no rescaling by tokens or processes).
    assert logs[0]["loss"] == pytest.approx(
        (logs[0]["layer_1_relative_error"] + logs[0]["layer_2_relative_error"]) / 2, rel=1e-3
    )


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> str:
    rng = random.Random(0)
    lines = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 15))) for _ in range(120)]
    path = tmp_path_factory.mktemp("corpus") / "corpus.txt"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def test_script_saves_a_student_that_fine_tunes(distill_attention, teacher_dir, corpus, tmp_path):
    args = ["--model_name_or_path", str(teacher_dir), "--train_files", corpus, "--block_size", "16"]
    args += ["--attention_type", "performer", "--attention_config", '{"num_features": 16}']
    args += ["--max_steps", "4", "--per_device_train_batch_size", "4", "--logging_steps", "2"]
    args += ["--validation_split_percentage", "20", "--random_state_redraw_steps", "2"]
    metrics = distill_attention.main([*args, "--output_dir", str(tmp_path), *COMMON])
    assert metrics["final_distillation_loss"] > 0 and metrics["eval_loss"] > 0
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["attention_type"] == "performer" and config["attention_config"]["num_features"] == 16
    assert config["architectures"] == ["EfficientBertModel"]
    assert (tmp_path / "vocab.txt").exists() or (tmp_path / "tokenizer.json").exists()
    card = (tmp_path / "README.md").read_text()
    assert f"Attention distilled from `{teacher_dir}`" in card and "Choromanski et al. 2021" in card
    assert "unlabelled blocks of 16 tokens" in card and "sum((student - teacher)^2) / sum(teacher^2)" in card
    model, info = EfficientBertForSequenceClassification.from_pretrained(tmp_path, output_loading_info=True)
    assert model.config.attention_type == "performer"
    assert sorted(info["missing_keys"]) == ["classifier.bias", "classifier.weight"]
    saved = EfficientBertModel.from_pretrained(tmp_path)
    original = EfficientBertModel.from_pretrained(teacher_dir)
    name = "encoder.layer.0.attention.self.query.weight"
    assert torch.equal(model.bert.state_dict()[name], saved.state_dict()[name])
    assert not torch.equal(saved.state_dict()[name], original.state_dict()[name])  # the student was trained


def test_script_refuses_to_distil_into_the_same_attention(distill_attention, teacher_dir, corpus, tmp_path):
    args = ["--model_name_or_path", str(teacher_dir), "--train_files", corpus, "--output_dir", str(tmp_path)]
    with pytest.raises(ValueError, match=r"nothing to distil.*--attention_type"):
        distill_attention.main([*args, *COMMON])
    with pytest.raises(ValueError, match=r"nothing to distil"):
        distill_attention.main([*args, "--attention_type", "full", *COMMON])


def test_script_distils_without_dropout_and_saves_the_checkpoints_rates(
    distill_attention, teacher_dir, corpus, tmp_path, monkeypatch
):
    """The student trains dropout-free (its teacher runs in eval mode); its config.json keeps the teacher's
    dropout for fine-tuning."""
    teacher_with_dropout = tmp_path / "teacher"
    model = EfficientBertModel.from_pretrained(
        teacher_dir, hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.2
    )
    model.save_pretrained(teacher_with_dropout)
    BertTokenizer.from_pretrained(teacher_dir).save_pretrained(teacher_with_dropout)
    trained = []
    original_compute_loss = AttentionDistillationTrainer.compute_loss

    def recording_compute_loss(self, model, inputs, *args, **kwargs):
        trained.append([m.p for m in model.modules() if isinstance(m, torch.nn.Dropout)])
        return original_compute_loss(self, model, inputs, *args, **kwargs)

    monkeypatch.setattr(AttentionDistillationTrainer, "compute_loss", recording_compute_loss)
    args = ["--model_name_or_path", str(teacher_with_dropout), "--train_files", corpus, "--block_size", "16"]
    args += [
        "--attention_type",
        "performer",
        "--attention_config",
        '{"num_features": 16}',
        "--max_steps",
        "2",
    ]
    distill_attention.main(
        [*args, "--per_device_train_batch_size", "4", "--output_dir", str(tmp_path / "out"), *COMMON]
    )
    assert trained and all(rates and set(rates) == {0.0} for rates in trained)
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["hidden_dropout_prob"] == 0.1 and config["attention_probs_dropout_prob"] == 0.2
    assert config["attention_type"] == "performer"
