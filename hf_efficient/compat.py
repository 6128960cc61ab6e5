"""The one place that touches private torch / transformers APIs, each behind a fallback.

Mechanism and model code import what they need from here, never a private name directly
(tests/test_compat.py fails if one of the names below disappears from the installed release, so an
upgrade that removes one is noticed before users meet the fallback).
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Callable

import torch
from transformers import PreTrainedModel

# ---- torch: saved-tensor hooks ----

# torch has no public way to ask whether saved-tensor hooks are installed; this private query exists in 2.x.
TOP_SAVED_TENSORS_HOOKS = "_top_saved_tensors_default_hooks"  # in torch._C._autograd


def saved_tensor_hooks_active() -> bool:
    """Whether saved-tensor hooks (``torch.autograd.graph.saved_tensors_hooks``: non-reentrant gradient
    checkpointing, ``save_on_cpu``...) are installed around the current code.

    Fallback, without torch's private query: True, so a caller that would install hooks of its own (and
    hide its tensors from the outer ones) steps aside, which is always correct."""
    top = getattr(getattr(torch._C, "_autograd", None), TOP_SAVED_TENSORS_HOOKS, None)
    return top is None or top(False) is not None


# ---- transformers: loading ----

# Steps of PreTrainedModel.from_pretrained a model may override (private: no public hook exists for them).
ADJUST_KEYS = "_adjust_missing_and_unexpected_keys"  # (self, loading_info), edits loading_info in place
FINALIZE_LOADING = "_finalize_model_loading"  # static (model, load_config, loading_info) -> loading_info
LOADED_FLAG = "_is_hf_initialized"  # set by from_pretrained on each tensor it loaded from the checkpoint


def loaded_from_checkpoint(tensor: torch.Tensor) -> bool:
    """Whether ``from_pretrained`` filled ``tensor`` from the checkpoint (rather than leaving it to be
    initialised). Fallback, without transformers' flag: False (the tensor is initialised afresh)."""
    return bool(getattr(tensor, LOADED_FLAG, False))


def hook_model_loading(
    cls: type[PreTrainedModel],
    adjust_keys: Callable[[PreTrainedModel, object], None],
    finalize: Callable[[PreTrainedModel, object, object, Callable], object],
) -> bool:
    """Route two steps of transformers' ``from_pretrained`` for ``cls`` (and its subclasses) through
    ``adjust_keys`` and ``finalize``; returns whether they are installed.

    ``adjust_keys(model, loading_info)`` runs after transformers adjusted ``loading_info.missing_keys`` /
    ``unexpected_keys`` and may edit them in place. ``finalize(model, load_config, loading_info, default)``
    replaces the end of loading and returns the ``loading_info``; ``default`` (same arguments) is
    transformers' own end (initialise what is missing, tie weights, log the LOAD REPORT).

    Fallback, on a transformers without these steps: nothing is installed and loading is transformers' own
    (its report stands, and a core's random state drawn from the seed is listed among the missing keys)."""
    if not (hasattr(PreTrainedModel, ADJUST_KEYS) and hasattr(PreTrainedModel, FINALIZE_LOADING)):
        return False

    def adjust(self, loading_info) -> None:
        getattr(super(cls, self), ADJUST_KEYS)(loading_info)
        adjust_keys(self, loading_info)

    def finish(model, load_config, loading_info):
        return finalize(model, load_config, loading_info, getattr(super(cls, cls), FINALIZE_LOADING))

    setattr(cls, ADJUST_KEYS, adjust)
    setattr(cls, FINALIZE_LOADING, staticmethod(finish))
    return True


# ---- transformers: config ----

ATTN_IMPLEMENTATION = "_attn_implementation"  # property of PretrainedConfig


def attn_implementation(config) -> str | None:
    """The attention kernel a transformers config asks for (``attn_implementation=`` of ``from_pretrained``,
    ``set_attn_implementation``), which transformers keeps in a private property; None when unset.
    Fallback, without it: None (callers then take ``"sdpa"``)."""
    return getattr(config, ATTN_IMPLEMENTATION, None)


# ---- torch: export ----

SIZE_OBLIVIOUS = ("torch.fx.experimental._config", "backed_size_oblivious")  # module, setting


def size_oblivious_tracing() -> contextlib.AbstractContextManager:
    """A context in which ``torch.export`` traces sizes "size oblivious": a dimension that happens to be 1,
    or to need no padding, in the example inputs does not specialise the program to that case.
    Fallback, without torch's private setting: no change (export may then specialise such a dimension, and
    fails on the dynamic shapes that it declared)."""
    module, setting = SIZE_OBLIVIOUS
    try:
        config = importlib.import_module(module)
    except ImportError:
        return contextlib.nullcontext()
    if not hasattr(config, setting):
        return contextlib.nullcontext()
    return config.patch(**{setting: True})
