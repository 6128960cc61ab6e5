"""The whole-sequence engine of kernelised attention (``linear``, ``performer``) for GPUs: the maths of
:mod:`hf_efficient.attention._kernelized` in a few large products, as the kernel ``"parallel"``.

On a GPU the chunked engine (:mod:`.kernelized`) is bound by its host work (per-chunk Python, a kernel
launch per small op, float32 copies of the features) and its products have d + 1 columns (the [V, 1]
trick), which tensor cores do not tile. This engine computes the same sums with fewer, larger ops:

- non-causal: S = phi_k^T V (m x d) and z = sum_j phi_k(k_j) (a reduction, float32), then
  out = phi_q S / (phi_q z + eps): two products over the whole sequence and one row reduction;
- causal (chunkwise parallel, as in flash-linear-attention and Yang et al. 2024, "Gated Linear Attention
  Transformers with Hardware-Efficient Training"): the sequence cut into blocks of ``block_size``, every
  block at once: each block's own state phi_k^T V, their exclusive prefix sum (float32) across blocks, and
  inside a block the masked quadratic form tril(phi_q phi_k^T) V, whose row sums are the block's share of
  the normaliser. No loop over chunks, so the host issues a fixed number of kernels whatever n is.

Products run in the inputs' dtype (half-precision matmuls accumulate in float32 inside, and their results
are the size of one output); the running sums across blocks and the normalisers are float32, as in the
reference. Memory is O(n (m + d) + (n / block_size) m d) per head: whole-sequence feature tensors, which a
GPU holds where the CPU's caches want chunks (peak memory per length: docs/gpu.md's reference run).

Feature maps with a stabilising shift (Performer's softmax kernel) need a shift per block in the causal
form, a sequential scan over blocks: that call goes to the chunked engine (``"auto"``) or raises when forced.
"""

from __future__ import annotations

import torch

from .._kernel_state import KernelState, accumulate_dtype, common_shift, masked_key_maxima
from ..base import AttentionOutput, Kernel
from ..utils import pad_to_multiple


def _shifted_causal(core, query, inputs) -> str | None:
    if inputs.is_causal and core.shifted_features:
        return (
            "its causal form with a stabilising shift (Performer's softmax kernel) scans the blocks in order"
        )
    return None


def parallel_kernelized(
    core, query, key, value, mask: torch.Tensor | None, causal: bool, state: KernelState | None = None
) -> tuple[torch.Tensor, KernelState | None]:
    """The core's kernelised attention over the whole sequence: (b, h, n, d) -> (b, h, n, d).

    Args:
        core: a :class:`~hf_efficient.attention._kernelized.KernelizedAttentionCore` (its feature maps,
            ``eps`` and ``block_size``).
        query, key, value: (b, h, n, d).
        mask: (b, n) bool, True = real token, or None.
        causal: query i sees keys j <= i only.
        state: causal only: the state of the tokens before these (None: they are the first).

    Returns:
        (output (b, h, n, d), the state after the last token; None for the non-causal form).
    """
    maps = core.feature_maps(query, mask)
    keep = None if mask is None else mask[:, None, :, None]  # (b, 1, n, 1)
    if keep is not None:
        value = value.masked_fill(~keep, 0.0)
    if maps.key_maxima is None:
        phi_k = maps.key_features(key, keep)  # (b, h, n, m), 0 at padded keys
    else:  # non-causal only (see _shifted_causal): one shift, the largest log-feature of any real key
        phi_k = maps.key_features(key, keep, common_shift(masked_key_maxima(key, mask, maps.key_maxima)))
    phi_q = maps.query_features(maps.query)  # (b, h, n, m)
    eps, work = core.config.eps, accumulate_dtype(value)  # work: float32 for half-precision inputs
    if not causal:
        sums = phi_k.transpose(-1, -2) @ value  # (b, h, m, d): S
        normaliser = phi_k.sum(-2, dtype=work)  # (b, h, m): z
        denominator = (phi_q @ normaliser[..., None].to(phi_q.dtype)).to(work)  # (b, h, n, 1)
        return ((phi_q @ sums).to(work) / (denominator + eps)).to(query.dtype), None
    return _causal_blocks(phi_q, phi_k, value, core.config.block_size, eps, state)


def _causal_blocks(phi_q, phi_k, value, block: int, eps: float, state: KernelState | None):
    """Chunkwise-parallel causal form (module docstring): phi_q, phi_k (b, h, n, m), value (b, h, n, d),
    from ``state`` (its [S | z] (b, h, m, d + 1)); returns (output, the state after the last token)."""
    n, work = phi_q.shape[2], accumulate_dtype(value)
    block = min(block, n)
    # zero rows after the end: no key contribution, their query rows are cut below
    phi_q, phi_k, value = (pad_to_multiple(t, block).unflatten(2, (-1, block)) for t in (phi_q, phi_k, value))
    # (b, h, g, block, m | d)
    own = (phi_k.transpose(-1, -2) @ value).to(work)  # (b, h, g, m, d): each block's phi_k^T V
    own_z = phi_k.sum(-2, dtype=work)  # (b, h, g, m)
    before = own.cumsum(2) - own  # exclusive prefix sums: the state of the tokens before each block
    before_z = own_z.cumsum(2) - own_z
    if state is not None:  # the tokens before this call: in every block's state
        carried = state.sums.to(work)
        before, before_z = before + carried[:, :, None, :, :-1], before_z + carried[:, :, None, :, -1]
    causal_mask = torch.ones(block, block, dtype=torch.bool, device=value.device).tril()
    scores = (phi_q @ phi_k.transpose(-1, -2)).masked_fill(~causal_mask, 0.0)  # (b, h, g, block, block)
    numerator = (phi_q @ before.to(phi_q.dtype)).to(work) + (scores @ value).to(work)  # (b, h, g, block, d)
    denominator = (phi_q @ before_z[..., None].to(phi_q.dtype)).to(work)
    denominator = denominator + scores.sum(-1, keepdim=True, dtype=work)  # (b, h, g, block, 1)
    sums = before[:, :, -1] + own[:, :, -1]  # (b, h, m, d): S after the last token
    final = KernelState(torch.cat([sums, (before_z[:, :, -1] + own_z[:, :, -1])[..., None]], -1), None)
    # rows after the end are cut before dividing: their 0 / eps is 0 / 0 with eps = 0 (NaN gradients)
    numerator, denominator = (t.flatten(2, 3)[:, :, :n] for t in (numerator, denominator))
    return (numerator / (denominator + eps)).to(value.dtype), final


def _attend_parallel(core, query, key, value, inputs, state=None, return_state=False):
    mask, causal = inputs.attention_mask, inputs.is_causal
    output, final = parallel_kernelized(core, query, key, value, mask, causal, state)
    return (AttentionOutput(output, None), final) if return_state else AttentionOutput(output, None)


# Taken by "auto" on CUDA (outside tracing: it does not trace): fewer, larger ops than the chunked engine.
PARALLEL = Kernel(
    "parallel", _attend_parallel, unsupported=_shifted_causal, carries_state=True, devices=frozenset({"cuda"})
)
