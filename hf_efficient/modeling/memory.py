"""Training-memory savings of the encoder blocks: a dropout that keeps a 1-byte mask, and a feed-forward that
recomputes its activation in backward instead of keeping it.

Both only change what autograd keeps for backward, never the maths: the outputs and gradients are those of
``nn.Dropout`` and of ``output(act(dense(x)), residual)``. They apply to training with gradients on large
tensors (at least :data:`MIN_ELEMENTS_TO_SAVE_MEMORY` elements), on CPU for the dropout, and stand aside
while tracing (``torch.export`` / ``torch.compile``) and under saved-tensor hooks someone else installed.
benchmarks/docs/performance.md has the measurements that chose the thresholds.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..attention.inputs import is_tracing
from ..compat import saved_tensor_hooks_active

# The two savings apply to tensors of at least this many elements; on smaller ones they cost little memory
# and the plain ops were measured faster.
MIN_ELEMENTS_TO_SAVE_MEMORY = 1 << 22
MASK_CHUNK = 1 << 20  # elements of float32 draws per step of CompactDropout's mask


class CompactDropout(nn.Dropout):
    """``nn.Dropout`` that keeps a 1-byte mask for backward, drawn fast on CPU.

    On CPU, ``F.dropout`` multiplies by a float noise tensor and saves it (4 bytes per element, two dropouts
    per layer); ``torch.native_dropout`` saves a bool mask but draws it with the slower ``bernoulli_``. Here
    the mask comes from uniform float32 draws (:func:`keep_mask`, so a bfloat16 input's p is not rounded)
    and the output is ``input * keep / (1 - p)``: autograd keeps only the bool mask, and the maths is
    dropout's. On CUDA, and while tracing, ``native_dropout`` stays (on CUDA one fused kernel). Only training
    with gradients on tensors of at least ``MIN_ELEMENTS_TO_SAVE_MEMORY`` elements takes these paths."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        large = input.numel() >= MIN_ELEMENTS_TO_SAVE_MEMORY
        if not (self.training and 0.0 < self.p < 1.0 and input.requires_grad and large):
            return F.dropout(input, self.p, self.training, self.inplace)
        if input.device.type != "cpu" or is_tracing():
            return torch.native_dropout(input, self.p, True)[0]
        return _MaskedScale.apply(input, keep_mask(input.shape, self.p), 1.0 / (1.0 - self.p))


class _MaskedScale(torch.autograd.Function):
    """input * keep * scale, keeping only the bool ``keep`` for backward, whose gradient is
    ``native_dropout``'s own backward op: one pass and one new tensor. Written as ``mul`` then ``mul_``,
    autograd's backward makes two, and the training step's peak memory rose above ``native_dropout``'s;
    with this Function it does not."""

    @staticmethod
    def forward(ctx, input: torch.Tensor, keep: torch.Tensor, scale: float) -> torch.Tensor:
        ctx.save_for_backward(keep)
        ctx.scale = scale
        return input.mul(keep).mul_(scale)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (keep,) = ctx.saved_tensors
        return torch.ops.aten.native_dropout_backward(grad, keep, ctx.scale), None, None


def keep_mask(shape: torch.Size, p: float) -> torch.Tensor:
    """A CPU bool tensor of ``shape``, each element True with probability 1 - p: ``rand >= p`` drawn
    ``MASK_CHUNK`` elements at a time, so the float32 draws take one chunk at a time, not four bytes per
    element of the whole shape (four times the mask itself)."""
    keep = torch.empty(shape, dtype=torch.bool)
    flat = keep.view(-1)
    for start in range(0, flat.numel(), MASK_CHUNK):
        part = flat[start : start + MASK_CHUNK]
        torch.ge(torch.rand(part.shape), p, out=part)
    return keep


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
