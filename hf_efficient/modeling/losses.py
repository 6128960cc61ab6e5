"""Losses over a vocabulary that never hold an (n, V) tensor: the language-modelling heads' training path.

A language model's last projection maps n hidden states onto V vocabulary logits. At BERT's V = 30,522 and
n = 16,384 tokens the logits alone are 2 GB, and ``F.cross_entropy`` keeps its log-softmax (another 2 GB)
for backward. :func:`chunked_cross_entropy` fuses the projection with the loss: it computes the logits of a
chunk of rows at a time, takes the chunk's loss and, when a gradient is wanted, the chunk's gradients at
once (softmax minus one-hot is all the backward of cross-entropy needs), then drops the chunk. What stays
alive is the loss, the gradient of the hidden states (n, D) and of the decoder (V, D): the size of the
inputs, not of the logits. The matrix products are the three a dense forward + backward does (logits,
hidden gradient, weight gradient), so nothing is recomputed.

Shapes: N rows (tokens), D hidden size, V vocabulary (classes), c rows per chunk.
"""

from __future__ import annotations

import torch
from torch.nn import functional as F

from ..attention.utils import ChunkBuffers, rows_per_chunk
from .checks import IGNORE_INDEX, check_class_labels

OWNER = "chunked_cross_entropy"


def _project(rows: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, out: torch.Tensor):
    """``out`` (c, V), float32 <- rows (c, D) @ weight.T + bias, written into the reused buffer."""
    if rows.dtype != torch.float32:  # half-precision products, float32 logits for the softmax
        return out.copy_(F.linear(rows, weight, bias))
    if bias is None:
        return torch.mm(rows, weight.T, out=out)
    return torch.addmm(bias, rows, weight.T, out=out)


class _FusedLinearCrossEntropy(torch.autograd.Function):
    """Sum over rows of cross-entropy(hidden @ weight.T + bias, labels) / count, gradients made in forward.

    Every row has a target (the caller dropped ignored rows). Gradients are computed in forward only for
    the inputs that need one (``ctx.needs_input_grad``) and scaled by the incoming gradient in backward.
    """

    @staticmethod
    def forward(ctx, hidden, weight, bias, labels, count, chunk_rows):
        # hidden (N, D), weight (V, D), bias (V,) or None, labels (N,) in [0, V), count: the mean's divisor.
        wants_hidden, wants_weight, wants_bias = ctx.needs_input_grad[:3]
        wants_bias = wants_bias and bias is not None
        grad_hidden = torch.empty_like(hidden) if wants_hidden else None
        # Accumulated over chunks in float32 whatever the parameters' dtype (bf16 sums would lose digits).
        float32 = dict(dtype=torch.float32, device=weight.device)
        grad_weight = torch.zeros(weight.shape, **float32) if wants_weight else None  # (V, D)
        grad_bias = torch.zeros(weight.shape[0], **float32) if wants_bias else None  # (V,)
        total = torch.zeros((), dtype=torch.float32, device=hidden.device)
        scratch = ChunkBuffers(hidden.new_empty((), dtype=torch.float32))
        for start in range(0, hidden.shape[0], chunk_rows):
            rows = hidden[start : start + chunk_rows]  # (c, D)
            targets = labels[start : start + chunk_rows]  # (c,)
            c = rows.shape[0]
            logits = _project(rows, weight, bias, out=scratch("logits", (c, weight.shape[0])))  # (c, V)
            log_norm = torch.logsumexp(logits, dim=-1)  # (c,)
            total += (log_norm - logits.gather(1, targets[:, None]).squeeze(1)).sum()
            if not (wants_hidden or wants_weight or wants_bias):
                continue
            # d loss / d logits = (softmax - one_hot) / count, built in place in the logits buffer.
            probs = logits.sub_(log_norm[:, None]).exp_()
            probs.scatter_add_(1, targets[:, None], probs.new_full((c, 1), -1.0)).div_(count)
            if wants_hidden:  # (c, V) @ (V, D)
                torch.mm(probs.to(weight.dtype), weight, out=grad_hidden[start : start + c])
            if wants_weight:
                grad_weight.addmm_(probs.T, rows.float())  # (V, c) @ (c, D)
            if wants_bias:
                grad_bias += probs.sum(0)
        ctx.save_for_backward(
            grad_hidden,
            None if grad_weight is None else grad_weight.to(weight.dtype),
            None if grad_bias is None else grad_bias.to(bias.dtype),
        )
        return total / count

    @staticmethod
    def backward(ctx, grad_loss):
        grads = [None if g is None else g * grad_loss.to(g.dtype) for g in ctx.saved_tensors]
        return *grads, None, None, None


def chunked_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    labels: torch.Tensor,
    chunk_size: int | None = None,
    ignore_index: int = IGNORE_INDEX,
) -> torch.Tensor:
    """Cross-entropy of ``hidden @ weight.T + bias`` against ``labels`` without building the logits.

    The value and gradients of ``F.cross_entropy(F.linear(hidden, weight, bias), labels)`` averaged over the
    positions that have a target (``labels != ignore_index``), with :func:`~hf_efficient.modeling.heads.
    mean_cross_entropy`'s convention that no target at all gives 0 (not NaN). Rows without a target are
    dropped before the projection (a masked LM scores 15% of its tokens; a causal LM skips padding), and
    the rest are projected ``chunk_size`` rows at a time, so peak memory holds one (chunk_size, V) block
    instead of (N, V) logits and their log-softmax. Gradients of ``hidden``, ``weight`` and ``bias`` are
    computed during the forward pass, chunk by chunk, and returned by backward (no second pass over the
    vocabulary); a forward under ``torch.no_grad()`` computes the loss only.

    Use it as the training loss of a head whose logits are a linear map of the last hidden states (a masked
    or causal LM's decoder, tied or not); a causal LM shifts first: ``hidden[:, :-1]``, ``labels[:, 1:]``.

    Args:
        hidden: (..., D) hidden states entering the decoder (after the head's transform).
        weight: (V, D) the decoder's weight (``nn.Linear(D, V).weight``, e.g. tied word embeddings).
        bias: (V,) the decoder's bias, or None.
        labels: (...) integer class ids in [0, V), ``ignore_index`` where there is no target; the leading
            shape of ``hidden``.
        chunk_size: rows projected at once; default: as many as keep a chunk's float32 logits under
            ``hf_efficient.attention.utils.CHUNK_BYTES`` (``CHUNK_BYTES // (4 * V)`` rows).
        ignore_index: the label of positions without a target (transformers' -100).

    Returns:
        The mean loss, a float32 scalar.

    Example:
        >>> loss = chunked_cross_entropy(hidden, model.cls.predictions.decoder.weight,
        ...                              model.cls.predictions.decoder.bias, labels)
    """
    if hidden.dim() < 1 or weight.dim() != 2 or hidden.shape[-1] != weight.shape[1]:
        raise ValueError(
            f"{OWNER}: hidden (..., D) must end in the decoder weight's D: hidden {tuple(hidden.shape)}, "
            f"weight {tuple(weight.shape)} (V, D). Pass the decoder's weight, not its transpose."
        )
    vocab = weight.shape[0]
    if bias is not None and tuple(bias.shape) != (vocab,):
        raise ValueError(f"{OWNER}: bias must have shape (V,) = ({vocab},), got {tuple(bias.shape)}.")
    if chunk_size is not None and chunk_size < 1:
        raise ValueError(f"{OWNER}: chunk_size must be a positive number of rows, got {chunk_size}.")
    fix = "Labels hold a class id per position and ignore_index (-100) where there is no target."
    check_class_labels(OWNER, labels, vocab, hidden.shape[:-1], "hidden's leading (...)", f"V={vocab}", fix)
    hidden, labels = hidden.reshape(-1, hidden.shape[-1]), labels.reshape(-1)
    scored = labels != ignore_index
    count = int(scored.sum())
    if count < labels.numel():  # keep only the rows that have a target (a gather, and the only host sync)
        hidden, labels = hidden[scored], labels[scored]
    if count == 0:  # 0 with zero gradients, as mean_cross_entropy
        zero = hidden.sum() * 0.0 + weight.sum() * 0.0  # connected to the inputs: backward gives zeros
        return (zero if bias is None else zero + bias.sum() * 0.0).float()
    rows = chunk_size or rows_per_chunk(4 * vocab, count)
    hidden, weight, bias = _in_one_dtype(hidden, weight, bias)
    with torch.autocast(hidden.device.type, enabled=False):  # the products' dtype is settled above
        return _FusedLinearCrossEntropy.apply(hidden, weight, bias, labels.long(), count, rows)


def _in_one_dtype(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None):
    """hidden, weight and bias in the dtype the projection computes in, cast (differentiably) where needed.

    Under autocast that is the autocast dtype, as for ``F.linear`` (hidden states come out of the head's
    transform in it while the decoder weight stays float32): the casts are outside the fused function, so
    autograd returns each gradient in its input's dtype (float32 for float32 parameters). Outside autocast the
    three must already agree: ``F.linear`` would refuse a mix as well."""
    device = hidden.device.type
    if torch.is_autocast_enabled(device):
        dtype = torch.get_autocast_dtype(device)
        return hidden.to(dtype), weight.to(dtype), None if bias is None else bias.to(dtype)
    dtypes = {hidden.dtype, weight.dtype} | ({bias.dtype} if bias is not None else set())
    if len(dtypes) > 1:
        raise ValueError(
            f"{OWNER}: hidden ({hidden.dtype}), weight ({weight.dtype}) and bias "
            f"({None if bias is None else bias.dtype}) must share one dtype. Cast the model as a whole "
            "(model.to(torch.bfloat16)), or run it under torch.autocast, which casts them for the projection."
        )
    return hidden, weight, bias
