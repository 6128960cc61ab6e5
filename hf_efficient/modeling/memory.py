"""Training-memory savings of the encoder blocks: a dropout that keeps a 1-byte mask (drawn fast on CPU), and
a feed-forward that recomputes its activation in backward instead of keeping it.

The feed-forward changes only what autograd keeps for backward, never the maths: its outputs and gradients are
``output(act(dense(x)), residual)``'s. It applies to training with gradients on large tensors (at least
:data:`MIN_ELEMENTS_TO_SAVE_MEMORY` elements) and stands aside while tracing (``torch.export`` /
``torch.compile``) and under saved-tensor hooks someone else installed. The dropout is dropout with p rounded
to a multiple of 1/65536 on CPU (:mod:`hf_efficient.attention.dropout`). benchmarks/docs/performance.md has
the measurements that chose the threshold and the mask.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..attention.dropout import fast_dropout
from ..attention.inputs import is_tracing
from ..compat import saved_tensor_hooks_active

# The recomputed feed-forward applies to activations of at least this many elements; on smaller ones it saves
# little memory and the plain ops were measured faster.
MIN_ELEMENTS_TO_SAVE_MEMORY = 1 << 22


class CompactDropout(nn.Dropout):
    """``nn.Dropout`` whose CPU mask is drawn fast and kept as 1 byte for backward
    (:func:`hf_efficient.attention.dropout.fast_dropout`: p rounded to a multiple of 1/65536, the output's
    expectation the input's). On CPU ``F.dropout`` draws a float per element and keeps a float noise tensor
    (4 bytes per element, two dropouts per layer). On CUDA ``F.dropout`` is one fused kernel that keeps a
    bool mask already, and it runs there, while tracing and with ``inplace``."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if self.inplace:
            return F.dropout(input, self.p, self.training, self.inplace)
        return fast_dropout(input, self.p, self.training)


class _RecomputedActivation:
    """Saved-tensor hooks for the feed-forward's second linear: the tensor it saves for its weight gradient,
    act(pre) (b, n, intermediate_size) or a view of it, is stored as its shape and recomputed from ``pre``
    in backward (elementwise, cheap). The activation keeps ``pre`` for its own backward anyway, so this
    saves one (b, n, intermediate_size) tensor per layer. Every other saved tensor (weights, the dropout
    mask, LayerNorm's input) passes through unchanged."""

    def __init__(self, pre: torch.Tensor, activation: nn.Module, activated: torch.Tensor):
        self.pre, self.activation = pre, activation
        self.storage = activated.untyped_storage().data_ptr()

    def pack(self, tensor: torch.Tensor):
        if tensor.untyped_storage().data_ptr() == self.storage:  # act(pre) or a view of it
            return (tensor.shape, tensor.stride(), tensor.storage_offset())
        return tensor

    def unpack(self, packed):
        if isinstance(packed, torch.Tensor):
            return packed
        shape, stride, offset = packed
        # No graph for the recompute: autograd gives the unpacked tensor the saved one's history (grad_fn),
        # so a double backward (create_graph=True) still differentiates through act(pre).
        with torch.no_grad():
            return self.activation(self.pre).as_strided(shape, stride, offset)


def feed_forward(layer: nn.Module, hidden_states: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
    """``layer.output(layer.intermediate(hidden_states), residual)``, BERT's and ViT's feed-forward names,
    through :func:`memory_saving_feed_forward`."""
    intermediate = layer.intermediate
    return memory_saving_feed_forward(
        layer, intermediate.dense, intermediate.intermediate_act_fn, layer.output, hidden_states, residual
    )


def memory_saving_feed_forward(
    layer: nn.Module,
    dense: nn.Module,
    activation: nn.Module,
    finish,
    hidden_states: torch.Tensor,
    residual: torch.Tensor,
) -> torch.Tensor:
    """``finish(activation(dense(hidden_states)), residual)``: a feed-forward under any family's names
    (``finish`` is the second projection with its dropout, residual and norm). Training with gradients, the
    activation's output, when it has at least ``MIN_ELEMENTS_TO_SAVE_MEMORY`` elements, is not kept for
    backward but recomputed (:class:`_RecomputedActivation`). Not while tracing, nor under saved-tensor hooks
    someone else installed (non-reentrant gradient checkpointing, ``torch.autograd.graph.save_on_cpu``...):
    ours would hide this region's tensors from them. ``layer``: whose ``training`` flag decides."""
    recompute = (
        layer.training and torch.is_grad_enabled() and not is_tracing() and not saved_tensor_hooks_active()
    )
    pre = dense(hidden_states)  # (b, n, intermediate_size)
    activated = activation(pre)
    if not recompute or activated.numel() < MIN_ELEMENTS_TO_SAVE_MEMORY:
        return finish(activated, residual)
    hooks = _RecomputedActivation(pre, activation, activated)
    with torch.autograd.graph.saved_tensors_hooks(hooks.pack, hooks.unpack):
        return finish(activated, residual)
