"""A step whose loss or gradient is not finite stops the run there (EfficientTrainer), naming the step and the
first parameter whose gradient is not finite, before the optimiser applies it: the checkpoints saved before
it stay finite and complete. ``allow_non_finite=True`` keeps transformers' carry-on behaviour."""

from __future__ import annotations

import pytest
import torch
from transformers import TrainerCallback

from hf_efficient import EfficientBertForSequenceClassification
from hf_efficient.training import EfficientTrainer, NonFiniteTrainingError, last_checkpoint
from hf_efficient.training.trainer import first_non_finite_gradient

from ..models.text.helpers import tiny_config
from .helpers import classification_examples, every_step_arguments

POISONED = "bert.encoder.layer.1.attention.self.query.weight"


class PoisonGradientAt(TrainerCallback):
    """From training step ``step`` on, the gradient of POISONED (and of every later parameter) becomes NaN, as
    an overflow inside that layer would make it."""

    def __init__(self, model, step: int):
        self.step, self.handles = step, []
        self.parameters = dict(model.named_parameters())

    def on_step_begin(self, args, state, control, **kwargs):
        if state.global_step + 1 == self.step:
            self.handles.append(self.parameters[POISONED].register_hook(lambda g: g * float("nan")))


def _trainer(tmp_path, step=3, **overrides):
    torch.manual_seed(0)
    model = EfficientBertForSequenceClassification(tiny_config(num_labels=2))
    args = every_step_arguments(tmp_path, max_steps=4, **overrides)
    trainer = EfficientTrainer(model=model, args=args, train_dataset=classification_examples())
    trainer.add_callback(PoisonGradientAt(model, step))
    return trainer


def test_a_non_finite_gradient_stops_the_run_at_its_step_keeping_the_checkpoints_before_it(tmp_path):
    trainer = _trainer(tmp_path)
    with pytest.raises(NonFiniteTrainingError, match=rf"step 3: the gradient of {POISONED} .*checkpoint-2"):
        trainer.train()
    assert last_checkpoint(tmp_path).name == "checkpoint-2"
    assert not (tmp_path / "checkpoint-3").exists()
    assert all(torch.isfinite(p).all() for p in trainer.model.parameters()), "the bad step was not applied"


def test_allow_non_finite_carries_on_as_transformers_does(tmp_path):
    trainer = _trainer(tmp_path, allow_non_finite=True)
    trainer.train()
    assert last_checkpoint(tmp_path).name == "checkpoint-4"


def test_first_non_finite_gradient_names_the_earliest_parameter():
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))
    model(torch.ones(1, 2)).sum().backward()
    assert first_non_finite_gradient(model) is None
    model[1].weight.grad[0, 0] = float("inf")
    model[1].bias.grad[0] = float("nan")
    assert first_non_finite_gradient(model) == "1.weight"
