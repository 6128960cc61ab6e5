"""Attention distillation: convert a pretrained encoder to another attention type before fine-tuning it.

A checkpoint whose attention is swapped for an approximation (Performer, linear, ...) starts far from the
function it was trained to compute. Following Kasai et al. 2021 ("Finetuning Pretrained Transformers into
RNNs") and Zhang et al. 2024 ("The Hedgehog & the Porcupine"), a short warm-up on unlabelled text trains the
*student* (the same weights with the new attention) to reproduce, layer by layer, the hidden states of the
*teacher* (the checkpoint with its original attention). The loss of one batch is

    loss = mean over layers l = 1..L of  sum_real ||s_l - t_l||^2 / sum_real ||t_l||^2

where s_l, t_l are the student's and teacher's hidden states after layer l and the sums run over real
(non-padding) tokens: a scale-free relative error, so every layer weighs the same. The embedding output
(l = 0) is skipped: it does not depend on attention. Nothing here knows about attention types.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn
from transformers import PreTrainedConfig, PreTrainedModel

from ..compat import trainer_prepare_inputs
from ..errors import InputError
from .trainer import EfficientTrainer


def layer_relative_errors(
    student_hidden: Sequence[torch.Tensor],
    teacher_hidden: Sequence[torch.Tensor],
    attention_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """The relative squared error of every layer's hidden states, over real tokens only.

    Args:
        student_hidden: the student's ``hidden_states``: L + 1 tensors (b, n, D), the embedding output first.
        teacher_hidden: the teacher's, same shapes.
        attention_mask: (b, n), 1/True = real token; ``None``: every token is real.

    Returns:
        (L,) float32: ``sum ||s - t||^2 / sum ||t||^2`` over the real tokens of each layer 1..L.
    """
    if len(student_hidden) != len(teacher_hidden):
        raise InputError(
            f"The student has {len(student_hidden) - 1} layers and the teacher {len(teacher_hidden) - 1}: "
            "distillation matches them one to one."
        )
    first = teacher_hidden[0]
    real = (
        torch.ones(first.shape[:2], dtype=torch.bool, device=first.device)
        if attention_mask is None
        else attention_mask.to(first.device).bool()
    )  # (b, n)
    errors = []
    for student, teacher in zip(student_hidden[1:], teacher_hidden[1:], strict=True):
        # Indexing (not multiplying by the mask) keeps whatever sits at padded positions, even inf, out.
        s, t = student[real].float(), teacher[real].float()  # (real tokens, D)
        errors.append((s - t).pow(2).sum() / t.pow(2).sum().clamp_min(torch.finfo(torch.float32).tiny))
    return torch.stack(errors)  # (L,)


def attention_settings(config: PreTrainedConfig) -> list[tuple[str, dict[str, Any]]]:
    """(attention_type, attention_config) of every layer of an hf_efficient encoder config."""
    return [config.attention_for_layer(layer) for layer in range(config.num_hidden_layers)]


def check_attention_changed(teacher_config: PreTrainedConfig, student_config: PreTrainedConfig) -> None:
    """Raise a ``ValueError`` when the student would use exactly the teacher's attention in every layer."""
    if attention_settings(teacher_config) == attention_settings(student_config):
        raise InputError(
            f"The student's attention ({student_config.attention_type!r}, attention_config "
            f"{student_config.attention_config or {}}) is the teacher's: there is nothing to distil. Choose "
            "the student's attention with --attention_type (e.g. --attention_type performer) and optionally "
            "--attention_config."
        )


class AttentionDistillationTrainer(EfficientTrainer):
    """An :class:`EfficientTrainer` whose loss is the student's per-layer relative error against a frozen
    teacher.

    The student is ``model`` (an encoder returning ``hidden_states``, e.g. ``EfficientBertModel`` with a new
    attention type); batches hold its inputs (``input_ids``, ``attention_mask``, ``token_type_ids``) and no
    labels. The loss is :func:`layer_relative_errors` averaged over layers, a plain per-batch mean (never
    rescaled by token counts or the number of processes); training logs also show each layer's error,
    averaged over the main process's batches since the previous log, as ``layer_<l>_relative_error``.
    ``evaluate`` reports the same loss as ``eval_loss`` (the student in eval mode: no dropout).

    Example:
        >>> teacher = EfficientBertModel.from_pretrained(path)
        >>> student = EfficientBertModel.from_pretrained(path, attention_type="performer")
        >>> trainer = AttentionDistillationTrainer(student, args, train_dataset=blocks, teacher=teacher)

    Args:
        teacher: the reference model with the same number of layers; it is frozen (eval mode, no gradients),
            moved to the student's device on first use, never optimised and never saved.
        *args, **kwargs: ``Trainer``'s.
    """

    # compute_loss returns a per-batch mean: Trainer divides it by the gradient accumulation steps and
    # neither passes num_items_in_batch to the model nor multiplies the loss by the number of processes.
    loss_is_scaled_for_ga = False

    def __init__(self, *args, teacher: PreTrainedModel, **kwargs):
        super().__init__(*args, **kwargs)
        self.model_accepts_loss_kwargs = False
        self.teacher = teacher.eval().requires_grad_(False)
        self._layer_error_sum: torch.Tensor | float = 0.0  # (L,) summed since the last log
        self._layer_error_batches = 0

    def compute_loss(
        self,
        model: nn.Module,
        inputs: dict[str, torch.Tensor],
        return_outputs: bool = False,
        num_items_in_batch: torch.Tensor | int | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, Any]:
        """Mean over layers of the student's relative error against the teacher, on real tokens."""
        device = next(model.parameters()).device
        if next(self.teacher.parameters()).device != device:
            self.teacher.to(device)
        with torch.no_grad():  # hidden states below: L + 1 tensors (b, n, D), the embedding output first
            teacher_hidden = self.teacher(**inputs, output_hidden_states=True).hidden_states
        outputs = model(**inputs, output_hidden_states=True)
        errors = layer_relative_errors(outputs.hidden_states, teacher_hidden, inputs.get("attention_mask"))
        if model.training:
            self._layer_error_sum = self._layer_error_sum + errors.detach()  # (L,)
            self._layer_error_batches += 1
        loss = errors.mean()
        return (loss, outputs) if return_outputs else loss

    def prediction_step(
        self,
        model: nn.Module,
        inputs: dict[str, torch.Tensor],
        prediction_loss_only: bool,
        ignore_keys: list[str] | None = None,
    ) -> tuple[torch.Tensor, None, None]:
        """Evaluation: the distillation loss of the batch (there are no labels or logits to return)."""
        inputs = trainer_prepare_inputs(self, inputs)
        with torch.no_grad(), self.compute_loss_context_manager():
            loss = self.compute_loss(model, inputs)
        return loss.detach(), None, None

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        """Add each layer's relative error (mean over the batches since the previous log) to training logs."""
        if "loss" in logs and self._layer_error_batches:
            means = (self._layer_error_sum / self._layer_error_batches).tolist()
            logs.update({f"layer_{i}_relative_error": round(m, 6) for i, m in enumerate(means, start=1)})
            self._layer_error_sum, self._layer_error_batches = 0.0, 0
        super().log(logs, start_time)
