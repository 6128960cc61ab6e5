"""Shared maths of kernelised (linear-time) attention: out_i = phi(q_i)^T S / (phi(q_i)^T z + eps).

With feature maps phi_q, phi_k mapping a head vector to m non-negative features,

    non-causal:  S = sum_j phi_k(k_j) v_j^T  (m x d),   z = sum_j phi_k(k_j)  (m)
    causal:      S_i, z_i as above but summed over j <= i only
    recurrent:   S_i = S_{i-1} + phi_k(k_i) v_i^T,  z_i = z_{i-1} + phi_k(k_i)   (the RNN form)

and out_i = phi_q(q_i)^T S / (phi_q(q_i)^T z + eps). Used by ``linear`` (Katharopoulos et al. 2020) and
``performer`` (Choromanski et al. 2021); the leading underscore keeps this module out of the registry's
auto-import. z rides along as an extra value column: values are extended to [v, 1] (d + 1 columns), so
one product gives numerator and denominator together.

This module holds the maths: the reference (:func:`kernelized_reference`: whole-sequence sums, and for the
causal form the masked quadratic form tril(phi_q phi_k^T) [V, 1], plus a carried state's contribution),
the recurrent step (:func:`kernelized_step`, token-by-token decoding) and the cores' base class. The
chunked, block-parallel engine that computes the same in O(n) memory is
:mod:`hf_efficient.attention.kernels.kernelized`, the whole-sequence one for GPUs
:mod:`~hf_efficient.attention.kernels.kernelized_parallel`; the state they all start from and return
(:class:`KernelState`), the feature maps and the helpers of the sums are in the leaf
:mod:`hf_efficient.attention._kernel_state`, so this module and the kernels do not import each other.

Half precision: with bfloat16 inputs, features and products run in bfloat16, while the sums S, z, the
query-side products and the division run in float32 (over n tokens they lose bfloat16's 8-bit
precision); the output is cast back. The cores run float16 inputs in float32 (``float32_for``): the
normaliser phi(q_i)^T z can be tiny at early causal positions, and gradients through 1 / (phi(q_i)^T z)
then leave float16's range although they are moderate in float32.

Stabilising shifts (feature maps exp(a_jf), Performer's): key features are computed as exp(a_jf - s) with a
shift s >= max_f a_jf so that none overflows; s cancels between numerator and denominator except in eps. A
causal query i must not depend on later keys, and incremental decoding only knows the keys so far, so the
shift of query i is the running maximum c_i = max_{j <= i} max_f a_jf: its output is
phi_q(q_i)^T S^(c_i) / (phi_q(q_i)^T z^(c_i) + eps), the sums expressed relative to c_i. Computed relative
to any C >= c_i instead, S^(c_i) = exp(C - c_i) S^(C), so out_i = phi_q S^(C) / (phi_q z^(C) + eps
exp(c_i - C)). The recurrent form keeps (S, z, c) and rescales S, z by exp(c_old - c_new) when a key raises
the maximum; the reference computes key j's features relative to its own c_j and weighs them by
exp(c_j - c_i) <= 1 in the sums of query i.
"""

from __future__ import annotations

import math

import torch

from ._kernel_state import (
    FeatureMaps,
    KernelState,
    Pointwise,
    accumulate_dtype,
    append_ones,
    common_shift,
    finite_or_zero,
    masked_key_maxima,
    normalise,
    plain,
    rescale,
)
from .base import AttentionCore, AttentionOutput
from .cache import RecurrentStateLayer
from .inputs import AttentionInputs
from .rotary import RotaryPositions, kernel_sums


def kernelized_reference(
    query,
    key,
    value,
    mask,
    maps: FeatureMaps,
    *,
    causal: bool,
    eps: float,
    state: KernelState | None = None,
    rotary: RotaryPositions | None = None,
) -> tuple[torch.Tensor, KernelState | None]:
    """The kernelised attention of the module docstring in one piece (plain differentiable ops).

    Args:
        query, key, value: (b, h, n, d); ``maps`` (from the core) maps ``maps.query`` and ``key``.
        mask: (b, n) bool, True = real token, or None.
        causal: query i sees keys j <= i only (and the tokens before this call, summed up in ``state``).
        state: causal only: the :class:`KernelState` before these tokens (None: they are the first).
        rotary: non-causal only: rotary positions, carried as RoFormer's eq. 19 (the feature maps rotated in
            the numerator, :func:`~hf_efficient.attention.rotary.kernel_sums`).

    Returns:
        (output (b, h, n, d), the state after the last token; None for the non-causal form).
    """
    keep = None if mask is None else mask[:, None, :, None]  # (b, 1, n, 1)
    value = append_ones(value if keep is None else value.masked_fill(~keep, 0.0))  # (b, h, n, d + 1)
    work = accumulate_dtype(value)
    maxima = None if maps.key_maxima is None else masked_key_maxima(key, mask, maps.key_maxima)  # (b, h, n)
    if not causal:
        key_features = maps.key_features
        if maxima is not None:  # one shift for all keys: the largest log-feature of any real key
            shift = common_shift(maxima)  # (b, h, 1, 1)
            key_features = lambda keys, keep: maps.key_features(keys, keep, shift)  # noqa: E731
        phi_k, phi_q = key_features(key, keep), maps.query_features(maps.query).to(work)  # (b, h, n, m)
        if rotary is not None:
            numerator, denominator = kernel_sums(phi_q, phi_k.to(work), value.to(work), rotary)
            return (numerator / (denominator + eps)).to(query.dtype), None
        sums = (phi_k.transpose(-1, -2) @ value).to(work)  # (b, h, m, d + 1): [S | z]
        return normalise(phi_q @ sums, eps).to(query.dtype), None
    n = value.shape[2]
    phi_q = maps.query_features(maps.query).to(work)  # (b, h, n, m)
    causal_mask = torch.ones(n, n, dtype=torch.bool, device=value.device).tril()
    weights = causal_mask.to(work)  # (n, n) | (b, h, n, n): the weight of key j in the sums of query i
    shift, earlier, carried = None, 1.0, None if state is None else state.sums  # [S | z] of earlier tokens
    if maxima is None:
        phi_k = maps.key_features(key, keep)  # (b, h, n, m)
    else:  # sums of query i relative to its own shift c_i: key j's features exp(a_jf - c_j) exp(c_j - c_i)
        running = maxima.to(work).cummax(-1).values  # (b, h, n): c_i
        if state is not None:
            running = torch.maximum(running, state.shift[..., 0])
        phi_k = maps.key_features(key, keep, finite_or_zero(running)[..., None])  # each <= 1; float32 shifts
        weights = rescale(running[..., None, :], running[..., :, None]).masked_fill(~causal_mask, 0.0)
        shift = running[..., -1:, None]  # (b, h, 1, 1): the shift of the state after the call
        if state is not None:
            earlier = rescale(state.shift, running[..., None])  # (b, h, n, 1): exp(c_state - c_i)
            carried = carried * rescale(state.shift, shift)  # relative to the new state's shift
    phi_k = phi_k.to(work)
    value = value.to(work)
    result = ((phi_q @ phi_k.transpose(-1, -2)) * weights) @ value  # (b, h, n, d + 1)
    sums = (phi_k * weights[..., -1, :, None]).transpose(-1, -2) @ value  # (b, h, m, d + 1) after the call
    if state is not None:
        result = result + earlier * (phi_q @ state.sums)
        sums = sums + carried
    return normalise(result, eps).to(query.dtype), KernelState(sums, shift)


def kernelized_step(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    real: torch.Tensor | None,
    maps: FeatureMaps,
    state: KernelState | None,
    eps: float,
) -> tuple[torch.Tensor, KernelState]:
    """One token of the causal (RNN) form: S += phi_k v^T, z += phi_k, out = phi_q^T S / (phi_q^T z + eps).

    Equal to the parallel causal form on the whole prefix (module docstring; with a shift, S and z are
    rescaled by exp(c_old - c_new) when the new key raises the running maximum c).

    Args:
        query, key, value: (b, h, 1, d), the current token (``maps`` maps ``maps.query`` and ``key``).
        real: (b,) bool, False where the token is padding (the state passes on unchanged), or None.
        state: the state after the previous token, or None at the start.
        eps: added to the denominator.

    Returns:
        (out (b, h, d), the new state).
    """
    keep = None if real is None else real[:, None, None, None]  # (b, 1, 1, 1)
    v_one = append_ones(value)  # (b, h, 1, d + 1)
    if keep is not None:
        v_one = v_one.masked_fill(~keep, 0.0)
    shift = None if state is None else state.shift
    if maps.key_maxima is None:
        phi_k = maps.key_features(key, keep)  # (b, h, 1, m)
        factor = 1.0
    else:
        mask = None if real is None else real[:, None]
        level = masked_key_maxima(key, mask, maps.key_maxima)  # (b, h, 1)
        level = level.to(accumulate_dtype(level))[..., None]  # (b, h, 1, 1)
        previous = torch.full_like(level, -math.inf) if shift is None else shift
        shift = torch.maximum(previous, level)
        phi_k = maps.key_features(key, keep, finite_or_zero(shift))
        factor = rescale(previous, shift)
    own = (phi_k.transpose(-1, -2) @ v_one).to(accumulate_dtype(v_one))  # (b, h, m, d + 1) outer product
    sums = own if state is None else state.sums * factor + own
    result = maps.query_features(maps.query).to(sums.dtype) @ sums  # (b, h, 1, d + 1)
    return normalise(result, eps)[:, :, 0].to(value.dtype), KernelState(sums, shift)


class KernelizedAttentionCore(AttentionCore):
    """Base of the cores whose attention is phi_q(q)^T S / (phi_q(q)^T z + eps) (``linear``, ``performer``):
    the reference, decoding from a :class:`~hf_efficient.attention.cache.RecurrentStateLayer` and the
    one-token :meth:`step`, all from the feature maps a subclass gives in :meth:`feature_maps`. Its config
    has ``eps`` and ``block_size`` (the chunked kernel's causal block length)."""

    # Whether the feature maps take a stabilising shift (FeatureMaps.key_maxima is not None), known without
    # building them: the kernels read it to choose a path.
    shifted_features: bool = False

    def feature_maps(self, query, attention_mask, pointwise: Pointwise = plain) -> FeatureMaps:
        """The :class:`FeatureMaps` of this call; ``pointwise`` applies the elementwise part of a map."""
        raise NotImplementedError

    def reference(self, query, key, value, inputs: AttentionInputs, state=None, return_state=False):
        """The maths in one piece; the causal form from ``state`` (a :class:`KernelState` or None) and, with
        ``return_state``, (AttentionOutput, the state after the last token) (:class:`Kernel`'s signature)."""
        maps = self.feature_maps(query, inputs.attention_mask)
        output, final = kernelized_reference(
            query, key, value, inputs.attention_mask, maps, causal=inputs.is_causal, eps=self.config.eps,
            state=state, rotary=inputs.rotary,
        )  # fmt: skip
        return (AttentionOutput(output, None), final) if return_state else AttentionOutput(output, None)

    def attend_across(self, query, key, value, inputs: AttentionInputs) -> AttentionOutput:
        """Cross-attention: the non-causal sums S, z over the other sequence's m keys (their padding in
        ``inputs.attention_mask``), read by each of the n queries."""
        maps = self.feature_maps(query, None)  # the mask is the keys'; no query is padding here
        output, _ = kernelized_reference(
            query, key, value, inputs.attention_mask, maps, causal=False, eps=self.config.eps
        )
        return AttentionOutput(output, None)

    def new_cache_layer(self) -> RecurrentStateLayer:
        return RecurrentStateLayer()

    def _attend_cached(self, query, key, value, inputs: AttentionInputs, layer) -> AttentionOutput:
        """One token through :func:`kernelized_step`, several (the prompt) through the causal form of the
        kernel chosen for the call (else the reference) from the state the layer holds; the layer keeps the
        state after them."""
        mask, n = inputs.attention_mask, query.shape[2]
        state = None if layer.state is None else KernelState(layer.state[0], (*layer.state[1:], None)[0])
        if n == 1:
            real = None if mask is None else mask[:, 0]
            output, state = self.step(query[:, :, 0], key[:, :, 0], value[:, :, 0], state, real)
            result = AttentionOutput(output[:, :, None], None)
        else:
            result, state = self._attend(query, key, value, inputs, state=state, return_state=True)
        layer.store([t for t in state if t is not None], n)  # (sums,) or (sums, shift)
        return result

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
        query, key, value = query[:, :, None], key[:, :, None], value[:, :, None]  # (b, h, 1, d)
        maps = self.feature_maps(query, None if real is None else real[:, None])
        return kernelized_step(query, key, value, real, maps, state, self.config.eps)
