"""Task heads and losses shared by the encoders (the same maths as transformers' BERT/ViT heads)."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F


def classification_loss(
    config, logits: torch.Tensor, labels: torch.Tensor, ignore_nan: bool = False
) -> torch.Tensor:
    """transformers' sequence-classification loss: regression (MSE), single-label (CE) or multi-label (BCE).

    ``config.problem_type`` is inferred on first use exactly as transformers does, and then saved.

    Args:
        logits: (b, num_labels).
        labels: (b,) int class ids, (b,) or (b, num_labels) floats for regression, or (b, num_labels)
            0/1 floats for multi-label.
        ignore_nan: regression / multi-label only: NaN labels are missing targets (OGB multi-task sets such
            as ogbg-molpcba) and the loss is the mean over the others (0 if none), not NaN. Off for
            transformers' behaviour.
    """
    num_labels = logits.shape[-1]
    if config.problem_type is None:
        if num_labels == 1:
            config.problem_type = "regression"
        elif labels.dtype in (torch.long, torch.int):
            config.problem_type = "single_label_classification"
        else:
            config.problem_type = "multi_label_classification"
    if config.problem_type == "regression":
        if num_labels == 1:
            # view(-1), not squeeze: a batch of one must stay (1,) on both sides.
            return _mean_loss(F.mse_loss, logits.view(-1), labels.reshape(-1).to(logits.dtype), ignore_nan)
        return _mean_loss(F.mse_loss, logits, labels.to(logits.dtype), ignore_nan)
    if config.problem_type == "single_label_classification":
        if labels.is_floating_point():
            raise ValueError(
                "single_label_classification needs integer class ids as labels, got floats. Pass class ids, "
                "or set problem_type='multi_label_classification' / 'regression'."
            )
        if labels.numel() and (int(labels.max()) >= num_labels or int(labels.min()) < -100):
            raise ValueError(
                f"labels hold class ids up to {int(labels.max())} but the model has num_labels={num_labels}. "
                "Load the model with num_labels set to the number of classes."
            )
        return F.cross_entropy(logits.view(-1, num_labels), labels.view(-1).long())  # int32 ids too
    if config.problem_type == "multi_label_classification":
        if labels.shape != logits.shape:
            raise ValueError(
                f"multi_label_classification needs labels of shape (batch, num_labels) = "
                f"{tuple(logits.shape)}, got {tuple(labels.shape)}."
            )
        return _mean_loss(F.binary_cross_entropy_with_logits, logits, labels.to(logits.dtype), ignore_nan)
    raise ValueError(
        f"Unknown problem_type {config.problem_type!r}; use regression, single_label_classification or "
        "multi_label_classification."
    )


def causal_lm_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Next-token cross-entropy, as transformers' causal LM loss: position i predicts ``labels[:, i + 1]``.

    Args:
        logits: (b, n, V).
        labels: (b, n) token ids (the inputs themselves; the shift is done here), -100 where not scored.

    Returns:
        The mean over scored positions, computed in float32.
    """
    targets = F.pad(labels, (0, 1), value=-100)[:, 1:].to(logits.device)  # (b, n): the next token, -100 last
    return F.cross_entropy(
        logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=-100
    )


def _mean_loss(loss_fn, logits: torch.Tensor, labels: torch.Tensor, ignore_nan: bool) -> torch.Tensor:
    """``loss_fn`` (MSE / BCE) averaged over the labels, or with ``ignore_nan`` over the non-NaN ones only
    (the others are zeroed by a mask, not indexed away: the same shapes, and no host sync)."""
    if not ignore_nan:
        return loss_fn(logits, labels)
    labelled = ~torch.isnan(labels)
    per_entry = loss_fn(logits, torch.where(labelled, labels, torch.zeros_like(labels)), reduction="none")
    return (per_entry * labelled).sum() / labelled.sum().clamp(min=1)


def classifier_dropout(config) -> nn.Dropout:
    """The dropout before a task head: ``classifier_dropout``, else ``hidden_dropout_prob`` (as BERT's)."""
    rate = config.classifier_dropout
    return nn.Dropout(config.hidden_dropout_prob if rate is None else rate)


class Pooler(nn.Module):
    """BERT's pooler: tanh(W h_0) on the first token."""

    def __init__(self, config):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.activation = nn.Tanh()

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.activation(self.dense(hidden_states[:, 0]))  # (b, n, D) -> (b, D)
