"""Checks of what a user hands a model's ``forward``: one place for every encoder and head.

A bad input must stop at the model's entry point with a ``ValueError`` that names the argument, the value
found and the fix, never travel on to an ``IndexError`` inside an embedding, a batch-size mismatch inside a
loss or a NaN. Two kinds of check live here:

* checks of shapes and dtypes (tensor metadata): always run, cost nothing and trace cleanly;
* checks that read tensor values (ids inside a table, finite floats, labels inside ``[0, num_labels)``):
  they need a host sync, so they run in eager mode only (:func:`checking_values` is False while
  ``torch.compile`` / ``torch.export`` trace the model) and only at the entry point, never per layer.

Losses of the heads live in :mod:`hf_efficient.modeling.heads`; the label checks they call are here.

Shapes: b = batch, n = sequence length (tokens, patches or nodes), C = classes.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..errors import InputError

IGNORE_INDEX = -100  # transformers' label for "no target here" (padding, unmasked tokens, unlabelled nodes)


def checking_values() -> bool:
    """Whether checks that read tensor values run: in eager mode yes, while compiling or exporting no."""
    return not torch.compiler.is_compiling()


def _shape(tensor: torch.Tensor) -> tuple[int, ...]:
    return tuple(tensor.shape)


def check_rank(owner: str, name: str, tensor: torch.Tensor, layout: str, fix: str = "") -> None:
    """``tensor`` has as many dimensions as ``layout`` names (``"(batch, seq)"`` -> 2)."""
    wanted = layout.count(",") + 1
    if tensor.dim() != wanted:
        raise InputError(
            f"{owner}: {name} must have shape {layout}, got {_shape(tensor)}." + (f" {fix}" if fix else "")
        )


def check_same_shape(owner: str, name: str, tensor: torch.Tensor, shape: Sequence[int], meaning: str) -> None:
    """``tensor.shape == shape``; ``meaning`` says what the shape is (``"(batch, seq) of input_ids"``)."""
    if _shape(tensor) != tuple(shape):
        raise InputError(f"{owner}: {name} must have shape {meaning} = {tuple(shape)}, got {_shape(tensor)}.")


def check_not_empty(owner: str, name: str, shape: Sequence[int], dims: str = "batch, seq") -> None:
    """No dimension of an input is 0: an empty batch or a zero-length sequence has nothing to encode."""
    if 0 in tuple(shape):
        raise InputError(
            f"{owner}: {name} has shape {tuple(shape)} ({dims}): a dimension is 0, so there is nothing to "
            "encode. Pass a non-empty batch of non-empty examples (drop empty ones before batching)."
        )


def check_ids(owner: str, name: str, ids: torch.Tensor, size: int, table: str, fix: str) -> None:
    """Integer ids that index a table of ``size`` rows: integer dtype, and (eager) every id in [0, size).

    Args:
        owner: the model, for the message.
        name: the argument (``input_ids``).
        table: what the rows are, with its config field (``"vocab_size=99 word embeddings"``).
        fix: how to get valid ids.
    """
    if ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
        raise InputError(f"{owner}: {name} must hold integer ids (torch.long), got dtype {ids.dtype}. {fix}")
    if not checking_values() or ids.numel() == 0:
        return
    low, high = torch.stack(torch.aminmax(ids)).tolist()  # one host sync
    if low < 0 or high >= size:
        raise InputError(
            f"{owner}: {name} holds ids in [{low}, {high}] but the {table} have rows [0, {size}). {fix}"
        )


def check_float_input(owner: str, name: str, tensor: torch.Tensor, fix: str) -> None:
    """A floating input whose values must be finite (pixels, embeddings, node features): floating dtype,
    and (eager) no NaN or infinity, which would turn every output it reaches into NaN."""
    if not tensor.is_floating_point():
        raise InputError(f"{owner}: {name} must be a floating tensor, got dtype {tensor.dtype}. {fix}")
    if checking_values() and tensor.numel() and not bool(torch.isfinite(tensor).all()):
        bad = int((~torch.isfinite(tensor)).sum())
        raise InputError(
            f"{owner}: {name} holds {bad} NaN or infinite value(s) of {tensor.numel()}; every output they "
            f"reach would be NaN. {fix}"
        )


def check_class_labels(
    owner: str,
    labels: torch.Tensor,
    num_classes: int,
    shape: Sequence[int],
    meaning: str,
    classes: str | None = None,
    fix: str | None = None,
    name: str = "labels",
) -> None:
    """Class-id labels of a head: integer dtype, ``shape`` (``meaning`` names it), ids in [0, num_classes)
    or -100 (no target).

    Args:
        classes: what the ids index, with its config field (default ``"num_labels=C"``).
        fix: how to get valid labels (default: set num_labels, or use float targets).
        name: the argument, for the message (``next_sentence_label`` beside an MLM's ``labels``).
    """
    classes = classes or f"num_labels={num_classes}"
    if fix is None:
        fix = (
            "Load the model with num_labels set to the number of classes, or set problem_type="
            "'multi_label_classification' / 'regression' for float targets."
        )
    if labels.is_floating_point() or labels.is_complex() or labels.dtype == torch.bool:
        raise InputError(
            f"{owner}: {name} must be integer class ids (torch.long; {IGNORE_INDEX} = no target), got dtype "
            f"{labels.dtype}. {fix}"
        )
    check_same_shape(owner, name, labels, shape, meaning)
    if not checking_values():
        return
    if labels.numel() == 0:
        return
    ignored, far = labels == IGNORE_INDEX, torch.iinfo(torch.int64).max
    low = labels.long().masked_fill(ignored, far).min()  # -100 (no target) never the smallest or largest
    high = labels.long().masked_fill(ignored, -far).max()
    low, high = torch.stack([low, high]).tolist()  # one host sync
    if low <= high and (low < 0 or high >= num_classes):  # low > high: every label is -100
        raise InputError(
            f"{owner}: {name} hold ids in [{low}, {high}] but {classes}: ids must be in [0, {num_classes}), "
            f"or {IGNORE_INDEX} for no target. {fix}"
        )


def check_binary_mask(
    owner: str, name: str, mask: torch.Tensor, shape: Sequence[int], meaning: str, fix: str
) -> None:
    """A mask over positions (``bool_masked_pos``): ``shape`` (``meaning`` names it), bool or integer dtype,
    and (eager) only 0 and 1, so that it selects positions rather than scales them."""
    if mask.is_floating_point() or mask.is_complex():
        raise InputError(f"{owner}: {name} must be a bool (or 0/1 integer) tensor, got {mask.dtype}. {fix}")
    check_same_shape(owner, name, mask, shape, meaning)
    if mask.dtype == torch.bool or not checking_values() or mask.numel() == 0:
        return
    low, high = torch.stack(torch.aminmax(mask)).tolist()  # one host sync
    if low < 0 or high > 1:
        raise InputError(f"{owner}: {name} holds values in [{low}, {high}]; it must hold only 0 and 1. {fix}")


def check_float_labels(
    owner: str, labels: torch.Tensor, shapes: Sequence[Sequence[int]], meaning: str, allow_nan: bool = False
) -> None:
    """Float targets (regression, multi-label) of one of ``shapes`` (``meaning`` names them); in eager mode
    finite, or with ``allow_nan`` free of infinities only (NaN = a missing target)."""
    if _shape(labels) not in [tuple(s) for s in shapes]:
        wanted = " or ".join(str(tuple(s)) for s in shapes)
        raise InputError(f"{owner}: labels must have shape {meaning} = {wanted}, got {_shape(labels)}.")
    if not (checking_values() and labels.is_floating_point() and labels.numel()):
        return
    bad = torch.isinf(labels) if allow_nan else ~torch.isfinite(labels)
    if bool(bad.any()):
        missing = "" if allow_nan else " (NaN targets count as missing only in the graph heads)"
        raise InputError(
            f"{owner}: labels hold {int(bad.sum())} {'infinite' if allow_nan else 'NaN or infinite'} "
            f"target(s); the loss would not be finite. Drop or fix those examples{missing}."
        )


__all__ = [
    "IGNORE_INDEX",
    "check_binary_mask",
    "check_class_labels",
    "check_float_input",
    "check_float_labels",
    "check_ids",
    "check_not_empty",
    "check_rank",
    "check_same_shape",
    "checking_values",
]
