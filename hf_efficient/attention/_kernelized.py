"""Shared maths of kernelised (linear-time) attention: out_i = phi(q_i)^T S / (phi(q_i)^T z + eps).

With feature maps phi_q, phi_k mapping a head vector to m non-negative features,

    non-causal:  S = sum_j phi_k(k_j) v_j^T  (m x d),   z = sum_j phi_k(k_j)  (m)
    causal:      S_i, z_i as above but summed over j <= i only

and out_i = phi_q(q_i)^T S / (phi_q(q_i)^T z + eps). Cost O(n m d) time, O(n (m + d)) memory. Used by
``linear`` (Katharopoulos et al. 2020) and ``performer`` (Choromanski et al. 2021); the leading underscore
keeps this module out of the registry's auto-import.

Half precision: with bfloat16 inputs, features and per-chunk products run in bfloat16 (one rounding per
chunk), while the running sums S, z, the query-side products and the division run in float32 (over n
tokens they lose bfloat16's 8-bit precision); the output is cast back. The cores run float16 inputs in
float32 (``AttentionCore.float32_for``): the normaliser phi(q_i)^T z can be tiny at early causal
positions, and gradients through 1 / (phi(q_i)^T z) then leave float16's range although they are moderate
in float32.

Two implementation choices keep it fast on CPU:
- z rides along as an extra value column: values are extended to [v, 1] (d + 1 columns), so one matmul
  gives numerator and denominator together.
- features are computed by the core's feature maps on chunks of the sequence, so no (n x m) feature tensor
  is ever built in one piece (glibc returns allocations over 32 MiB to the OS; see ``utils.CHUNK_BYTES``).

The causal form is computed in parallel: the sequence is cut into blocks of ``block_size`` tokens; within
a block the masked quadratic form phi_q phi_k^T (lower triangle) is used, across blocks an exclusive prefix
sum of the per-block states S, z; groups of blocks are processed in turn carrying the running state, so
every intermediate stays under the chunk budget and memory is linear in n. It can start from a state and
return the state it ends in (:class:`KernelState`): that is the prefill of incremental decoding, and
:func:`kernelized_step` is one token of the same recurrence (the RNN form).

Stabilising shifts (feature maps exp(a_jf), Performer's): key features are computed as exp(a_jf - s) with a
shift s >= max_f a_jf so that none overflows; s cancels between numerator and denominator except in eps. A
causal query i must not depend on later keys, and incremental decoding only knows the keys so far, so the
shift of query i is the running maximum c_i = max_{j <= i} max_f a_jf: its output is
phi_q(q_i)^T S^(c_i) / (phi_q(q_i)^T z^(c_i) + eps), the sums expressed relative to c_i. The recurrent
form keeps (S, z, c) and rescales S, z by exp(c_old - c_new) when a key raises the maximum. The parallel
form computes each block's features relative to C, the running maximum at the block's end (so no feature of
the block exceeds 1), carries the state across blocks rescaled by exp(C_prev - C), and gives query i the
eps of its own shift: S^(c_i) = exp(C - c_i) S^(C), so out_i = phi_q S^(C) / (phi_q z^(C) + eps
exp(c_i - C)). Both forms give the same outputs up to rounding.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from typing import NamedTuple

import torch
import torch.nn.functional as F

from .base import AttentionCore, AttentionOutput
from .cache import RecurrentStateLayer
from .inputs import AttentionInputs, is_tracing
from .utils import CHUNK_BYTES, feature_chunk_budget, rows_per_chunk

# Chunk budget for (chunk x m) feature tensors. Well below utils.CHUNK_BYTES: forward+backward of the
# performer at n=4096..16384 ran ~20% faster with 4-8 MiB chunks than with 24 MiB ones (cache reuse), and
# 512+ rows per chunk keep the matmuls large.
FEATURE_CHUNK_BYTES = 8 * 2**20

QueryFeatureFn = Callable[[torch.Tensor], torch.Tensor]  # (b, h, c, d) -> (b, h, c, m)
# (keys (b, h, c, d), keep (b, 1, c, 1) bool or None) -> (b, h, c, m), exactly 0 where keep is False; with
# key_maxima, a third argument: the shift (b, h, c | 1, 1) to subtract from the log-features before exp
KeyFeatureFn = Callable[..., torch.Tensor]


class KernelState(NamedTuple):
    """The state of causal kernelized attention after some tokens (what incremental decoding keeps).

    Attributes:
        sums: (b, h, m, d + 1) [sum_j phi_k(k_j) v_j^T | sum_j phi_k(k_j)] over the keys so far, in the
            accumulation dtype (float32 for half-precision inputs).
        shift: (b, h, 1, 1) (float32 or wider), the stabilising shift the sums are relative to (the running
            maximum of the keys' log-features; -inf before the first real key), or None for feature maps
            without one.
    """

    sums: torch.Tensor
    shift: torch.Tensor | None


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


def append_ones(value: torch.Tensor) -> torch.Tensor:
    """(b, h, n, d) -> (b, h, n, d + 1): the extra column of ones accumulates the normaliser z."""
    return F.pad(value, (0, 1), value=1.0)


def normalise(result: torch.Tensor, eps: float) -> torch.Tensor:
    """(..., d + 1) numerator and denominator side by side -> (..., d) attention output."""
    numerator, denominator = result.split([result.shape[-1] - 1, 1], dim=-1)  # split: one cat in backward
    return numerator / (denominator + eps)


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
            need a stabilising shift; ``key_features`` then takes the shift as a third argument (see the
            module docstring). None: features need no shift.
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
        budget = budget or feature_chunk_budget(FEATURE_CHUNK_BYTES, value.device)
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
        shift = _finite_or_zero(key_maxima.amax(-1, keepdim=True)[..., None])  # (b, h, 1, 1)
        key_features = partial_shift(key_features, shift)
    state = None  # (b, h, m, d + 1): [S | z]
    for _, k, v, kp, _ in chunks:
        part = (key_features(k, kp).transpose(-1, -2) @ v).to(accumulate_dtype(v))  # (b, h, m, d + 1)
        state = part if state is None else state + part
    outputs = [  # (b, h, c, d) each
        normalise(query_features(q).to(state.dtype) @ state, eps).to(dtype) for q, _, _, _, _ in chunks
    ]
    return torch.cat(outputs, dim=2) if len(outputs) > 1 else outputs[0]


def partial_shift(key_features: KeyFeatureFn, shift: torch.Tensor) -> KeyFeatureFn:
    """``key_features`` with its shift argument fixed."""
    return lambda keys, keep: key_features(keys, keep, shift)


def _finite_or_zero(x: torch.Tensor) -> torch.Tensor:
    """-inf (no real key) -> 0: a stand-in shift where every feature is 0 anyway."""
    return torch.where(torch.isfinite(x), x, torch.zeros_like(x))


def _rescale(earlier: torch.Tensor, later: torch.Tensor) -> torch.Tensor:
    """exp(earlier - later) for non-decreasing shifts, 1 where both are -inf (nothing accumulated yet)."""
    return torch.where(earlier == later, torch.ones_like(later), (earlier - later).exp())


def accumulate_dtype(x: torch.Tensor) -> torch.dtype:
    """float32 for half-precision tensors (running sums, normalisers), else the tensor's own dtype."""
    return torch.promote_types(x.dtype, torch.float32)


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
            per_row = _finite_or_zero(block_shift).expand(b, h, g, block).reshape(b, h, r, 1)[:, :, :c]
            phi_k = key_features(k, kp, per_row.to(k.dtype))  # (b, h, c, m), each <= 1
            # eps of each query's own shift: eps exp(c_i - C). A row before any real key is a padded query: it
            # keeps eps (factor 1), so its 0 / eps stays finite in backward.
            factor = torch.where(torch.isfinite(running), (running - _finite_or_zero(block_shift)).exp(), 1.0)
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
                sums = sums * _rescale(previous, level)
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


def kernelized_step(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    real: torch.Tensor | None,
    query_features: QueryFeatureFn,
    key_features: KeyFeatureFn,
    state: KernelState | None,
    eps: float,
    key_maximum: torch.Tensor | None = None,
) -> tuple[torch.Tensor, KernelState]:
    """One token of the causal (RNN) form: S += phi_k v^T, z += phi_k, out = phi_q^T S / (phi_q^T z + eps).

    Equal to the parallel causal form on the whole prefix (module docstring; with a shift, S and z are
    rescaled by exp(c_old - c_new) when the new key raises the running maximum c).

    Args:
        query, key, value: (b, h, d), the current token.
        real: (b,) bool, False where the token is padding (the state passes on unchanged), or None.
        query_features, key_features: the core's feature maps (as for :func:`kernelized_attention`).
        state: the state after the previous token, or None at the start.
        eps: added to the denominator.
        key_maximum: (b, h), the key's largest log-feature (-inf if padding), for feature maps with a shift.

    Returns:
        (out (b, h, d), the new state).
    """
    b, h, d = value.shape
    keep = None if real is None else real[:, None, None, None]  # (b, 1, 1, 1)
    one = key[:, :, None]  # (b, h, 1, d)
    v_one = append_ones(value[:, :, None])  # (b, h, 1, d + 1)
    if keep is not None:
        v_one = v_one.masked_fill(~keep, 0.0)
    shift = None if state is None else state.shift
    if key_maximum is None:
        phi_k = key_features(one, keep)  # (b, h, 1, m)
        rescale = 1.0
    else:
        level = key_maximum.to(accumulate_dtype(key_maximum))[..., None, None]  # (b, h, 1, 1)
        previous = torch.full_like(level, -math.inf) if shift is None else shift
        shift = torch.maximum(previous, level)
        phi_k = key_features(one, keep, _finite_or_zero(shift).to(key.dtype))
        rescale = _rescale(previous, shift)
    own = (phi_k.transpose(-1, -2) @ v_one).to(accumulate_dtype(v_one))  # (b, h, m, d + 1) outer product
    sums = own if state is None else state.sums * rescale + own
    result = query_features(query[:, :, None]).to(sums.dtype) @ sums  # (b, h, 1, d + 1)
    return normalise(result, eps)[:, :, 0].to(value.dtype), KernelState(sums, shift)


def decode(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    query_features: QueryFeatureFn,
    key_features: KeyFeatureFn,
    num_features: int,
    layer,
    *,
    eps: float,
    block_size: int,
    key_maxima: torch.Tensor | None = None,
) -> torch.Tensor:
    """n new tokens after the state a :class:`~hf_efficient.attention.cache.RecurrentStateLayer` holds: one
    token through :func:`kernelized_step`, several (the prompt) through the parallel causal form; the layer
    keeps the state after them. Arguments as :func:`kernelized_attention`; returns (b, h, n, d)."""
    state = None if layer.state is None else KernelState(layer.state[0], (*layer.state[1:], None)[0])
    n = query.shape[2]
    if n == 1:
        real = None if attention_mask is None else attention_mask[:, 0]
        out, state = kernelized_step(
            query[:, :, 0], key[:, :, 0], value[:, :, 0], real, query_features, key_features, state, eps,
            None if key_maxima is None else key_maxima[:, :, 0],
        )  # fmt: skip
        out = out[:, :, None]
    else:
        out, state = kernelized_attention(
            query, key, value, attention_mask, query_features, key_features, num_features, causal=True,
            eps=eps, block_size=block_size, key_maxima=key_maxima, state=state, return_state=True,
        )  # fmt: skip
    layer.store([t for t in state if t is not None], n)  # (sums,) or (sums, shift)
    return out


class KernelizedAttentionCore(AttentionCore):
    """Base of the cores whose attention is phi_q(q)^T S / (phi_q(q)^T z + eps) (``linear``, ``performer``):
    the parallel forms, decoding from a :class:`~hf_efficient.attention.cache.RecurrentStateLayer` and the
    one-token :meth:`step`, all from the feature maps a subclass gives in :meth:`_kernel_arguments`. Its
    config has ``eps`` and ``block_size``."""

    def _kernel_arguments(self, query, key, attention_mask) -> dict:
        """``query`` (padded rows may be zeroed), ``query_features``, ``key_features``, ``num_features`` and
        ``key_maxima`` (None for feature maps without a stabilising shift) of :func:`kernelized_attention`."""
        raise NotImplementedError

    def _attend(self, query, key, value, inputs: AttentionInputs) -> AttentionOutput:
        arguments = self._kernel_arguments(query, key, inputs.attention_mask)
        output = kernelized_attention(
            arguments.pop("query"), key, value, inputs.attention_mask, **arguments,
            causal=inputs.is_causal, eps=self.config.eps, block_size=self.config.block_size,
        )  # fmt: skip
        return AttentionOutput(output, None)

    def new_cache_layer(self) -> RecurrentStateLayer:
        return RecurrentStateLayer()

    def _attend_cached(self, query, key, value, inputs: AttentionInputs, layer) -> AttentionOutput:
        arguments = self._kernel_arguments(query, key, inputs.attention_mask)
        output = decode(
            arguments.pop("query"), key, value, inputs.attention_mask, layer=layer, eps=self.config.eps,
            block_size=self.config.block_size, **arguments,
        )  # fmt: skip
        return AttentionOutput(output, None)

    def step(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        state: KernelState | None = None,
        real: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, KernelState]:
        """Causal attention for one new token, as an RNN (equal to ``is_causal=True`` on the whole prefix).

        Args:
            query, key, value: (b, h, d) projections of the current token.
            state: the :class:`KernelState` returned by the previous step ([S | z] (b, h, m, d + 1) and, for
                feature maps with a stabilising shift, the shift), or None for the first token.
            real: (b,) bool, False where this token is padding: the state passes on unchanged.

        Returns:
            (output (b, h, d), new state).
        """
        mask = None if real is None else real[:, None]  # (b, 1)
        arguments = self._kernel_arguments(query[:, :, None], key[:, :, None], mask)
        maxima = arguments["key_maxima"]
        return kernelized_step(
            arguments["query"][:, :, 0], key, value, real, arguments["query_features"],
            arguments["key_features"], state, self.config.eps, None if maxima is None else maxima[:, :, 0],
        )  # fmt: skip
