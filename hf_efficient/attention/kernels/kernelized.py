"""The chunked engine of kernelised attention (``linear``, ``performer``): the maths of
:mod:`hf_efficient.attention._kernelized` in O(n (m + d)) memory, as the kernel ``"chunked"``.

- Features are computed by the core's feature maps on chunks of the sequence, so no (n x m) feature tensor
  is ever built in one piece (chunk-sized tensors stay under :data:`~hf_efficient.attention.utils.
  CHUNK_BYTES`, below glibc's threshold for returning memory to the OS; see there). Non-causal: the state
  [S | z] summed over the key chunks, then every query chunk against it.
- The causal form is computed in parallel: the sequence is cut into blocks of ``block_size`` tokens;
  within a block the masked quadratic form phi_q phi_k^T (lower triangle) is used, across blocks an
  exclusive prefix sum of the per-block states S, z; groups of blocks are processed in turn carrying the
  running state, so every intermediate stays under the chunk budget and memory is linear in n. It can
  start from a state and return the state it ends in (:class:`~hf_efficient.attention._kernel_state.
  KernelState`): that is the prefill of incremental decoding.
- Stabilising shifts: each block's key features are computed relative to C, the running maximum at the
  block's end (so no feature of the block exceeds 1), the state is carried across blocks rescaled by
  exp(C_prev - C), and query i gets the eps of its own shift, eps exp(c_i - C) (see ``_kernelized``).
- Elementwise feature maps whose derivative is a function of their output keep only that output for
  backward (:func:`feature_map_keeping_output`), so the queries and keys are freed after forward.

While tracing (``torch.export`` / ``torch.compile``) it computes in one chunk with plain ops, so the kernel
traces.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable

import torch
import torch.nn.functional as F

from .._kernel_state import (
    KernelState,
    KeyFeatureFn,
    QueryFeatureFn,
    accumulate_dtype,
    append_ones,
    common_shift,
    finite_or_zero,
    masked_key_maxima,
    normalise,
    rescale,
)
from ..base import AttentionOutput, Kernel
from ..inputs import is_tracing
from ..utils import CHUNK_BYTES, device_chunk_budget, row_slices, rows_per_chunk

# Chunk budget for (chunk x m) feature tensors, well below utils.CHUNK_BYTES: smaller chunks reuse the
# cache better, and 512+ rows per chunk keep the matmuls large.
FEATURE_CHUNK_BYTES = 8 * 2**20


def feature_map_keeping_output(
    x: torch.Tensor,
    keep: torch.Tensor | None,
    apply: Callable[[torch.Tensor, torch.Tensor | None], torch.Tensor],
    slope: Callable[[torch.Tensor], torch.Tensor],
) -> torch.Tensor:
    """phi = apply(x, keep) for an elementwise feature map whose derivative is a function of its output,
    d phi / d x = slope(phi) (0 where ``keep`` is False, since phi is 0 there).

    While recording gradients (outside tracing) only phi is kept for backward: the products that read phi keep
    it anyway, so x (the queries or keys, or a temporary the map's plain ops would copy) is freed after
    forward. Otherwise ``apply`` runs as plain ops (torch.export / ONNX see those). ``apply`` may overwrite x
    only where x is a temporary of the caller's."""
    if torch.is_grad_enabled() and x.requires_grad and not is_tracing():
        return _OutputKeepingMap.apply(x, keep, apply, slope)
    return apply(x, keep)


class _OutputKeepingMap(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, keep, apply, slope):
        phi = apply(x, keep)  # not recorded: apply's in-place ops are free here
        if phi.data_ptr() == x.data_ptr():  # computed in x's place: autograd must know (double backward)
            ctx.mark_dirty(x)
        ctx.slope = slope
        ctx.save_for_backward(phi)
        return phi

    @staticmethod
    def backward(ctx, grad):
        (phi,) = ctx.saved_tensors
        return grad * ctx.slope(phi), None, None, None  # differentiable in phi: double backward works


def chunked_key_maxima(key: torch.Tensor, mask, maxima: Callable, num_features: int) -> torch.Tensor:
    """:func:`~hf_efficient.attention._kernel_state.masked_key_maxima` in chunks of the feature budget."""
    b, h, n, _ = key.shape
    budget = device_chunk_budget(FEATURE_CHUNK_BYTES, key.device)
    rows = rows_per_chunk(b * h * num_features * key.element_size(), n, budget)
    parts = [
        masked_key_maxima(key[:, :, piece], None if mask is None else mask[:, piece], maxima)
        for piece in row_slices(n, rows)  # one slice of everything while tracing
    ]
    return torch.cat(parts, dim=2) if len(parts) > 1 else parts[0]


def chunked_kernelized(core, query, key, value, mask, causal: bool, state: KernelState | None = None):
    """The core's attention through :func:`kernelized_attention`, with output-keeping feature maps: (output
    (b, h, n, d), the state after the last token (None when not causal))."""
    maps = core.feature_maps(query, mask, feature_map_keeping_output)
    maxima = None
    if maps.key_maxima is not None:
        maxima = chunked_key_maxima(key, mask, maps.key_maxima, maps.num_features)
    result = kernelized_attention(
        maps.query, key, value, mask, maps.query_features, maps.key_features, maps.num_features,
        causal=causal, eps=core.config.eps, block_size=core.config.block_size, key_maxima=maxima,
        state=state, return_state=causal,
    )  # fmt: skip
    return result if causal else (result, None)


def _attend_chunked(core, query, key, value, inputs, state=None, return_state=False):
    mask, causal = inputs.attention_mask, inputs.is_causal
    output, final = chunked_kernelized(core, query, key, value, mask, causal, state)
    return (AttentionOutput(output, None), final) if return_state else AttentionOutput(output, None)


# Taken by "auto" for every call (while tracing in one chunk with plain ops).
CHUNKED = Kernel("chunked", _attend_chunked, traces=True, carries_state=True)


def kernelized_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    query_features: QueryFeatureFn,
    key_features: KeyFeatureFn,
    num_features: int,
    *,
    causal: bool,
    eps: float,
    block_size: int = 64,
    budget: int | None = None,
    key_maxima: torch.Tensor | None = None,
    state: KernelState | None = None,
    return_state: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, KernelState]:
    """Linear attention with feature maps applied chunk by chunk; see the module docstring.

    Args:
        query, key, value: (b, h, n, d).
        attention_mask: (b, n) bool, True = real token, or None.
        query_features: phi_q on a chunk of queries.
        key_features: phi_k on a chunk of keys and its padding mask; padded rows must come out exactly 0.
        num_features: m, the feature dimension (for chunk sizing).
        causal: query i sees keys j <= i only.
        eps: added to the denominator.
        block_size: causal block length (the masked quadratic form works on blocks of this size).
        budget: bytes allowed for the largest intermediate of one chunk (default: FEATURE_CHUNK_BYTES,
            or utils.CHUNK_BYTES for the causal form, which prefers larger groups).
        key_maxima: (b, h, n), the largest log-feature of each key (-inf at padding), for feature maps that
            need a stabilising shift; ``key_features`` then takes the shift as a third argument. None:
            features need no shift.
        state: causal only: the state before these tokens (None: they are the first).
        return_state: causal only: also return the state after them.

    Returns:
        (b, h, n, d) output, and with ``return_state`` the :class:`KernelState` after the last token.
    """
    if not causal and (state is not None or return_state):
        raise ValueError("kernelized_attention: a carried state is for the causal form only (causal=True).")
    b, h, n, _ = value.shape
    keep = None if attention_mask is None else attention_mask[:, None, :, None]  # (b, 1, n, 1)
    if keep is not None:
        value = value.masked_fill(~keep, 0.0)
    value = append_ones(value)  # (b, h, n, d + 1)
    itemsize = value.element_size()
    if causal:
        block = min(block_size, n)
        # Larger groups pay off here (fewer, bigger batched ops): size them by the largest single
        # intermediate per token (features, block scores or a share of the block states), under CHUNK_BYTES.
        widest = max(num_features, block, num_features * value.shape[-1] // block)
        rows = rows_per_chunk(b * h * itemsize * widest, n, budget or CHUNK_BYTES)
        rows = max(block, rows // block * block)
    else:
        budget = budget or device_chunk_budget(FEATURE_CHUNK_BYTES, value.device)
        rows = rows_per_chunk(b * h * num_features * itemsize, n, budget)
    if is_tracing():  # one chunk: a traced graph (torch.export / torch.compile) has no loop over chunks
        chunks = [(query, key, value, keep, key_maxima)]
        block = (
            block_size  # blocks of block_size even for shorter inputs (min(block_size, n) would guard on n)
        )
    else:
        # split (not slicing per chunk): backward concatenates once instead of zero-filling a full-size
        # gradient per slice.
        chunks = zip(
            query.split(rows, dim=2),
            key.split(rows, dim=2),
            value.split(rows, dim=2),
            itertools.repeat(None) if keep is None else keep.split(rows, dim=2),
            itertools.repeat(None) if key_maxima is None else key_maxima.split(rows, dim=2),
            strict=False,
        )
    if causal:
        output, final = _causal(chunks, query_features, key_features, block, eps, state)
        return (output, final) if return_state else output
    return _non_causal(list(chunks), query_features, key_features, key_maxima, eps, query.dtype)


def _non_causal(chunks, query_features: QueryFeatureFn, key_features: KeyFeatureFn, key_maxima, eps, dtype):
    """Non-causal form over chunks of (queries, keys, [values, 1], keep, key maxima): the state [S | z] summed
    over the key chunks, then every query chunk against it. ``key_maxima`` (b, h, n) or None: the per-key
    log-feature maxima of a shifted feature map (Performer's), whose largest real one shifts every key."""
    if key_maxima is not None:  # one shift for all keys: the largest log-feature of any real key
        shift = common_shift(key_maxima)  # (b, h, 1, 1)
        key_features = _partial_shift(key_features, shift)
    state = None  # (b, h, m, d + 1): [S | z]
    for _, k, v, kp, _ in chunks:
        part = (key_features(k, kp).transpose(-1, -2) @ v).to(accumulate_dtype(v))  # (b, h, m, d + 1)
        state = part if state is None else state + part
    outputs = [  # (b, h, c, d) each
        normalise(query_features(q).to(state.dtype) @ state, eps).to(dtype) for q, _, _, _, _ in chunks
    ]
    return torch.cat(outputs, dim=2) if len(outputs) > 1 else outputs[0]


def _partial_shift(key_features: KeyFeatureFn, shift: torch.Tensor) -> KeyFeatureFn:
    """``key_features`` with its shift argument fixed."""
    return lambda keys, keep: key_features(keys, keep, shift)


def _causal(chunks, query_features, key_features, block: int, eps: float, state: KernelState | None):
    """Causal form over chunks of whole blocks (the last may be short), carrying the running [S | z] (and its
    shift); returns (output (b, h, n, d), the state after the last token)."""
    sums = None if state is None else state.sums  # (b, h, m, d + 1): [S | z] of all earlier tokens
    shift = None if state is None else state.shift  # (b, h, 1, 1) or None
    outputs = []
    causal_mask = None
    for q, k, v, kp, maxima in chunks:
        c, extra = q.shape[2], (-q.shape[2]) % block  # zero rows: no key contribution, cut below
        b, h = q.shape[:2]
        r, g = c + extra, (c + extra) // block
        phi_q = F.pad(query_features(q), (0, 0, 0, extra)).reshape(b, h, g, block, -1)  # (b, h, g, block, m)
        row_eps = eps
        if maxima is None:
            phi_k = key_features(k, kp)
        else:
            # running shift c_i = max over real keys j <= i (and the carried state's shift)
            running = maxima.to(accumulate_dtype(maxima)).cummax(-1).values  # (b, h, c)
            if shift is not None:
                running = torch.maximum(running, shift[..., 0])
            running = torch.cat([running, running[..., -1:].expand(b, h, extra)], -1).view(b, h, g, block)
            block_shift = running[..., -1:]  # (b, h, g, 1): C at each block's end
            per_row = finite_or_zero(block_shift).expand(b, h, g, block).reshape(b, h, r, 1)[:, :, :c]
            phi_k = key_features(k, kp, per_row)  # (b, h, c, m), each <= 1
            # eps of each query's own shift: eps exp(c_i - C). A row before any real key is a padded query: it
            # keeps eps (factor 1), so its 0 / eps stays finite in backward.
            factor = torch.where(torch.isfinite(running), (running - finite_or_zero(block_shift)).exp(), 1.0)
            row_eps = eps * factor.view(b, h, r, 1)
        phi_k = F.pad(phi_k, (0, 0, 0, extra)).reshape(b, h, g, block, -1)  # (b, h, g, block, m)
        v = F.pad(v, (0, 0, 0, extra))  # (b, h, r, d + 1)
        m, d1 = phi_q.shape[-1], v.shape[-1]
        v = v.reshape(b, h, g, block, d1)  # (b, h, g, block, d + 1)
        work = accumulate_dtype(v)
        local = (phi_k.transpose(-1, -2) @ v).to(work)  # (b, h, g, m, d + 1): each block's own state
        if sums is None:
            sums = local.new_zeros(b, h, m, d1)
        if maxima is None:
            inclusive = local.cumsum(dim=2) + sums[:, :, None]  # (b, h, g, m, d + 1)
            before = torch.cat([sums[:, :, None], inclusive[:, :, :-1]], dim=2)  # exclusive prefix sum
            sums = inclusive[:, :, -1]
        else:
            # a short scan over the blocks: the carried state moves to each block's shift (a factor <= 1)
            before = []
            previous = torch.full_like(block_shift[:, :, 0, :, None], -math.inf) if shift is None else shift
            for own, level in zip(local.unbind(2), block_shift.unbind(2), strict=True):
                level = level[..., None]  # (b, h, 1, 1)
                sums = sums * rescale(previous, level)
                before.append(sums)
                sums, previous = sums + own, level
            before = torch.stack(before, 2)  # (b, h, g, m, d + 1)
            shift = previous
        if causal_mask is None:
            causal_mask = torch.ones(block, block, dtype=torch.bool, device=v.device).tril()
        scores = (phi_q @ phi_k.transpose(-1, -2)).masked_fill_(~causal_mask, 0.0)  # (b, h, g, block, block)
        result = phi_q.to(work) @ before + (scores @ v).to(work)  # (b, h, g, block, d + 1)
        result = result.reshape(b, h, r, d1)[:, :, :c]  # (b, h, c, d + 1), zero rows cut before dividing
        if maxima is not None:
            row_eps = row_eps[:, :, :c]
        outputs.append(normalise(result, row_eps).to(v.dtype))
    output = torch.cat(outputs, dim=2) if len(outputs) > 1 else outputs[0]
    return output, KernelState(sums, shift)
