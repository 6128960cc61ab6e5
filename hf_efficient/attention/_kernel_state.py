"""The state and the small helpers of kernelised attention (``linear``, ``performer``), shared by its
reference (:mod:`hf_efficient.attention._kernelized`) and its kernels (:mod:`.kernels.kernelized`,
:mod:`.kernels.kernelized_parallel`): the feature maps a core hands over (:class:`FeatureMaps`), the state
of the causal form after some tokens (:class:`KernelState`, what a cached prefill starts from and ends in)
and the sums' bookkeeping (the [V, 1] column, the division, the accumulation dtype, stabilising shifts).

A leaf: it imports nothing of the package, so the reference and every kernel import it and not each other.
The maths behind each helper is in ``_kernelized``'s module docstring.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch
import torch.nn.functional as F

QueryFeatureFn = Callable[[torch.Tensor], torch.Tensor]  # (b, h, c, d) -> (b, h, c, m)
# (keys (b, h, c, d), keep (b, 1, c, 1) bool or None) -> (b, h, c, m), exactly 0 where keep is False; for
# feature maps with a shift, a third argument: the shift (b, h, c | 1, 1) to subtract before exp
KeyFeatureFn = Callable[..., torch.Tensor]
# (x (b, h, c, d), keep or None, apply(x, keep), slope(phi)) -> apply(x, keep): how an elementwise feature
# map is applied (the reference: as plain ops; the chunked kernel keeps only phi for backward)
Pointwise = Callable[..., torch.Tensor]


def plain(x: torch.Tensor, keep: torch.Tensor | None, apply: Callable, slope: Callable) -> torch.Tensor:
    """An elementwise feature map as plain differentiable ops (``slope``, its derivative, is not needed)."""
    return apply(x, keep)


class FeatureMaps(NamedTuple):
    """What a kernelised core gives the maths: its feature maps on this call's queries and keys.

    Attributes:
        query: (b, h, n, d), the queries to map (padded rows may be zeroed).
        query_features: phi_q on (a chunk of) the queries.
        key_features: phi_k on (a chunk of) the keys and its padding mask; padded rows come out exactly 0.
        num_features: m.
        key_maxima: keys (b, h, c, d) -> (b, h, c), the largest log-feature max_f a_jf of each key, for
            feature maps with a stabilising shift (``key_features`` then takes the shift); None without one.
    """

    query: torch.Tensor
    query_features: QueryFeatureFn
    key_features: KeyFeatureFn
    num_features: int
    key_maxima: Callable[[torch.Tensor], torch.Tensor] | None


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


def append_ones(value: torch.Tensor) -> torch.Tensor:
    """(b, h, n, d) -> (b, h, n, d + 1): the extra column of ones accumulates the normaliser z."""
    return F.pad(value, (0, 1), value=1.0)


def normalise(result: torch.Tensor, eps: float | torch.Tensor) -> torch.Tensor:
    """(..., d + 1) numerator and denominator side by side -> (..., d) attention output."""
    numerator, denominator = result.split([result.shape[-1] - 1, 1], dim=-1)  # split: one cat in backward
    return numerator / (denominator + eps)


def accumulate_dtype(x: torch.Tensor) -> torch.dtype:
    """float32 for half-precision tensors (running sums, normalisers), else the tensor's own dtype."""
    return torch.promote_types(x.dtype, torch.float32)


def finite_or_zero(x: torch.Tensor) -> torch.Tensor:
    """-inf (no real key) -> 0: a stand-in shift where every feature is 0 anyway."""
    return torch.where(torch.isfinite(x), x, torch.zeros_like(x))


def rescale(earlier: torch.Tensor, later: torch.Tensor) -> torch.Tensor:
    """exp(earlier - later) for non-decreasing shifts, 1 where both are -inf (nothing accumulated yet)."""
    return torch.where(earlier == later, torch.ones_like(later), (earlier - later).exp())


@torch.no_grad()
def masked_key_maxima(key: torch.Tensor, mask: torch.Tensor | None, maxima: Callable) -> torch.Tensor:
    """The largest log-feature of each key, -inf at padded keys: (b, h, n, d) -> (b, h, n). A constant
    (detached): the shift it gives cancels out of the outputs except in eps."""
    per_key = maxima(key)  # (b, h, n), a new tensor
    return per_key if mask is None else per_key.masked_fill_(~mask[:, None], float("-inf"))


def common_shift(maxima: torch.Tensor) -> torch.Tensor:
    """The non-causal form's one shift for all keys: the largest log-feature of any real key, (b, h, n) ->
    (b, h, 1, 1) (0 where no key is real)."""
    return finite_or_zero(maxima.amax(-1, keepdim=True)[..., None])
