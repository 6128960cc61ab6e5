"""Task heads and losses shared by the encoders (the same maths as transformers' BERT/ViT heads).

Every loss checks its labels against the logits first (:mod:`hf_efficient.modeling.checks`): a label of
another shape, dtype or range raises naming it instead of failing inside ``cross_entropy``; a batch in which
no position has a target (every label -100) gives a loss of 0, not NaN.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F
from transformers.activations import ACT2FN

from ..attention.inputs import is_tracing
from ..attention.utils import CHUNK_BYTES, rows_per_chunk
from ..errors import InputError
from .checks import IGNORE_INDEX, check_class_labels, check_float_labels, check_same_shape, checking_values

# A loss without autograd reads the labelled rows of the logits within the shared chunk budget: each chunk's
# gathered rows and log-softmax stay in the malloc arena instead of two fresh (rows, V) tensors paged in anew
# (benchmarks/docs/performance.md, "Why the kernels are cut the way they are").
NO_GRAD_LOSS_CHUNK_BYTES = CHUNK_BYTES


def mean_cross_entropy(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Cross-entropy averaged over the positions that have a target (labels != -100).

    The same value as ``F.cross_entropy(..., ignore_index=-100)``, except that a batch without any target
    (a batch of padding, an MLM batch in which nothing was masked) gives 0 with zero gradients instead of
    NaN (0 / 0), which would otherwise poison the optimizer state.

    Only the rows with a target go through the log-softmax: over a masked LM's b x n x V logits the rest
    (85% of them) cost a sixth of a MiniLM-size evaluation forward at 16 x 512 for labels of -100. Without
    autograd (evaluation) those rows are read a few at a time (``NO_GRAD_LOSS_CHUNK_BYTES``), never all of
    them copied at once. The same loss and gradients.

    Args:
        logits: (..., C).
        labels: (...) class ids, -100 where there is no target.
    """
    logits, labels = logits.reshape(-1, logits.shape[-1]), labels.reshape(-1).long()
    scored = labels != IGNORE_INDEX
    count = scored.sum()
    if is_tracing():  # no data-dependent shapes in an exported graph: every row, the ignored ones skipped
        total = F.cross_entropy(logits, labels, ignore_index=IGNORE_INDEX, reduction="sum")
    elif torch.is_grad_enabled() and logits.requires_grad:
        # One gather, so that backward writes one (N, C) gradient (a gather per chunk would write one each).
        if 2 * int(count) < labels.numel():
            logits, labels = logits[scored], labels[scored]
        total = F.cross_entropy(logits, labels, ignore_index=IGNORE_INDEX, reduction="sum")
    else:
        rows = scored.nonzero().squeeze(1)
        row_bytes = logits.shape[-1] * logits.element_size()
        chunk = rows_per_chunk(row_bytes, rows.numel(), budget=NO_GRAD_LOSS_CHUNK_BYTES)
        total = logits.new_zeros((), dtype=torch.float32)
        for part in rows.split(chunk):
            part_logits = logits.index_select(0, part)
            total += F.cross_entropy(part_logits, labels.index_select(0, part), reduction="sum").float()
        total = total.to(logits.dtype)
    return total / count.clamp(min=1)


def classification_loss(
    config, logits: torch.Tensor, labels: torch.Tensor, ignore_nan: bool = False, owner: str = "the model"
) -> torch.Tensor:
    """transformers' sequence-classification loss: regression (MSE), single-label (CE) or multi-label (BCE).

    ``config.problem_type`` is inferred on first use exactly as transformers does, and saved once the
    labels have passed their checks (a wrong first batch does not fix the problem type for good).

    Args:
        logits: (b, num_labels).
        labels: (b,) int class ids (-100: no target), (b,) or (b, num_labels) floats for regression, or
            (b, num_labels) 0/1 floats for multi-label.
        ignore_nan: regression / multi-label only: NaN labels are missing targets (OGB multi-task sets such
            as ogbg-molpcba) and the loss is the mean over the others (0 if none), not NaN. Off for
            transformers' behaviour (NaN labels then raise).
        owner: the model, named by the errors.
    """
    b, num_labels = logits.shape
    problem_type = config.problem_type
    if problem_type is None:
        if num_labels == 1:
            problem_type = "regression"
        elif labels.dtype in (torch.long, torch.int):
            problem_type = "single_label_classification"
        else:
            problem_type = "multi_label_classification"
    if problem_type == "regression":
        shapes = [(b,), (b, 1)] if num_labels == 1 else [(b, num_labels)]
        check_float_labels(owner, labels, shapes, "(batch, num_labels)", allow_nan=ignore_nan)
        # view(-1), not squeeze: a batch of one must stay (1,) on both sides.
        logits = logits.view(-1) if num_labels == 1 else logits
        loss = _mean_loss(F.mse_loss, logits, labels.reshape(logits.shape).to(logits.dtype), ignore_nan)
    elif problem_type == "single_label_classification":
        if labels.dim() == 2 and labels.shape == (b, 1):
            labels = labels.view(b)
        check_class_labels(owner, labels, num_labels, (b,), "(batch,)")
        loss = mean_cross_entropy(logits, labels)  # int32 ids too
    elif problem_type == "multi_label_classification":
        check_float_labels(owner, labels, [(b, num_labels)], "(batch, num_labels)", allow_nan=ignore_nan)
        loss = _mean_loss(F.binary_cross_entropy_with_logits, logits, labels.to(logits.dtype), ignore_nan)
    else:
        raise ValueError(
            f"{owner}: unknown problem_type {problem_type!r}; use regression, single_label_classification or "
            "multi_label_classification."
        )
    config.problem_type = problem_type
    return loss


def span_loss(
    owner: str,
    start_logits: torch.Tensor,
    end_logits: torch.Tensor,
    start_positions: torch.Tensor | None,
    end_positions: torch.Tensor | None,
    attention_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Extractive question answering's loss, as transformers' ``BertForQuestionAnswering``: the mean of the
    cross-entropies of the start and of the end position; a position at or past the input's n tokens (an
    answer the window does not hold) is ignored. Where no position of the batch is scored the loss is 0, not
    NaN (:func:`mean_cross_entropy`).

    Args:
        start_logits, end_logits: (b, n).
        start_positions, end_positions: (b,) or (b, 1) token indices of the answer's first and last token.
        attention_mask: (b, n) 1 = real token: padded positions take no probability (transformers' loss
            softmaxes over them too, so the two differ on padded batches; never where nothing is padded).
    """
    b, n = start_logits.shape
    if start_positions is None or end_positions is None:
        raise InputError(
            f"{owner}: pass both start_positions and end_positions (the answer's first and last token), or "
            "neither; got only " + ("start_positions." if end_positions is None else "end_positions.")
        )
    losses = []
    for name, positions, logits in (
        ("start_positions", start_positions, start_logits),
        ("end_positions", end_positions, end_logits),
    ):
        if positions.is_floating_point() or positions.is_complex() or positions.dtype == torch.bool:
            raise InputError(
                f"{owner}: {name} must be integer token indices (torch.long), got {positions.dtype}."
            )
        if positions.dim() > 1:
            positions = positions.squeeze(-1)
        check_same_shape(owner, name, positions, (b,), "(batch,) of the inputs")
        if checking_values() and positions.numel() and int(positions.min()) < 0:
            raise InputError(
                f"{owner}: {name} holds {int(positions.min())}: token indices start at 0 (the [CLS] token, "
                f"the target of an unanswerable question); an index >= the input's {n} tokens is ignored."
            )
        ignored = positions.clamp(0, n) == n  # past the input: no target here
        if attention_mask is not None:  # a padded position is never an answer: it takes no probability
            logits = logits.masked_fill(~attention_mask.bool(), torch.finfo(logits.dtype).min)
        losses.append(mean_cross_entropy(logits, positions.masked_fill(ignored, IGNORE_INDEX)))
    return (losses[0] + losses[1]) / 2


# The keywords of transformers' causal-LM loss (ForCausalLMLoss) that Trainer and sequence-parallel training
# pass to a causal LM's forward.
CAUSAL_LM_LOSS_KWARGS = ("shift_labels", "num_items_in_batch", "ignore_index")


def check_loss_kwargs(owner: str, loss_kwargs: dict) -> None:
    """Refuse keywords other than :data:`CAUSAL_LM_LOSS_KWARGS` (with or without labels: without, they are
    unused, as in transformers, e.g. Trainer's num_items_in_batch when a label smoother took the labels)."""
    unknown = sorted(set(loss_kwargs) - set(CAUSAL_LM_LOSS_KWARGS))
    if unknown:
        raise InputError(
            f"{owner}.forward got unexpected keyword arguments {unknown}: besides its named inputs it takes "
            f"the loss keywords {', '.join(CAUSAL_LM_LOSS_KWARGS)} (transformers' ForCausalLMLoss). Remove "
            "them."
        )


def causal_lm_targets(labels: torch.Tensor, loss_kwargs: dict) -> tuple[torch.Tensor, object]:
    """The (b, n) target of each position of a causal LM (-100 where none) and the ``num_items_in_batch``
    to divide by, from ``labels`` and transformers' loss keywords, as ``ForCausalLMLoss`` reads them.

    Args:
        labels: (b, n) token ids (the inputs themselves): position i predicts ``labels[:, i + 1]``.
        loss_kwargs: ``shift_labels`` (b, n), targets already aligned with the positions (sequence-parallel
            training shifts before sharding), used instead of shifting ``labels``; ``num_items_in_batch``
            (Trainer's count of targets over devices and accumulation steps); ``ignore_index``, the label of
            positions without a target (default -100).
    """
    shift_labels = loss_kwargs.get("shift_labels")
    targets = next_token_targets(labels) if shift_labels is None else shift_labels
    ignore_index = loss_kwargs.get("ignore_index", IGNORE_INDEX)
    if ignore_index != IGNORE_INDEX:
        targets = targets.masked_fill(targets == ignore_index, IGNORE_INDEX)
    return targets, loss_kwargs.get("num_items_in_batch")


def per_item_loss(mean_loss: torch.Tensor, targets: torch.Tensor, num_items_in_batch=None) -> torch.Tensor:
    """A loss averaged over this batch's targets, or with ``num_items_in_batch`` their sum divided by it
    (transformers' ``fixed_cross_entropy``: the mean over every target of a step when Trainer accumulates
    gradients or runs on several devices)."""
    if num_items_in_batch is None:
        return mean_loss
    scored = (targets != IGNORE_INDEX).sum().to(mean_loss.device)
    return mean_loss * scored / torch.as_tensor(num_items_in_batch, device=mean_loss.device)


def next_token_targets(labels: torch.Tensor) -> torch.Tensor:
    """(b, n) labels -> (b, n) targets of each position: the next token's label, -100 at the last."""
    return F.pad(labels, (0, 1), value=IGNORE_INDEX)[:, 1:]


def _mean_loss(loss_fn, logits: torch.Tensor, labels: torch.Tensor, ignore_nan: bool) -> torch.Tensor:
    """``loss_fn`` (MSE / BCE) averaged over the labels (0 for none), or with ``ignore_nan`` over the non-NaN
    ones only (the others are zeroed by a mask, not indexed away: the same shapes, and no host sync)."""
    if not ignore_nan:
        return loss_fn(logits, labels) if labels.numel() else logits.sum() * 0.0
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


class FirstTokenClassifier(nn.Module):
    """RoBERTa's and ELECTRA's sentence classifier (``classifier.dense``, ``classifier.out_proj``) on the
    first token: dropout -> dense -> activation (tanh for RoBERTa, gelu for ELECTRA) -> dropout -> out_proj.
    (b, n, D) -> (b, num_labels)."""

    def __init__(self, config, activation: str):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.dropout = classifier_dropout(config)
        self.activation = ACT2FN[activation]
        self.out_proj = nn.Linear(config.hidden_size, config.num_labels)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        first = self.dropout(hidden_states[:, 0])  # (b, D): <s> / [CLS]
        return self.out_proj(self.dropout(self.activation(self.dense(first))))
