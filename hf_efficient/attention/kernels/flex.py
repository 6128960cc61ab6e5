"""FlexAttention paths of the structured cores: block-sparse masks built from a core's layout.

PyTorch's FlexAttention (``torch.nn.attention.flex_attention``) computes softmax attention over the blocks a
``BlockMask`` lists, with a ``mask_mod`` (which (query, key) pairs are allowed) applied inside partial
blocks and a ``score_mod`` (an additive bias) on every score; on CUDA it compiles into one fused kernel
whose cost follows the blocks kept. The cores with a structured pattern (``full`` with padding, causality
or a per-head bias; ``longformer``; ``bigbird``; ``swin_window``) describe their pattern here:

* ``mask_mod(b, h, q, k) -> bool``: the exact token-level pattern (used inside partial blocks only);
* a block-level pattern over blocks of ``FLEX_BLOCK`` tokens, computed from sizes and the layout (never by
  evaluating the token pattern n^2 times): ``partial`` (b|1, h|1, nq, nk), True where a block pair may hold
  an allowed pair, and optionally ``full`` where every pair is allowed (no mask_mod needed there).

Each of those cores lists a ``Kernel("flex", ...)`` with :func:`flex_unsupported` and
:data:`FLEX_DEVICES`: ``implementation="auto"`` takes it when the inputs are on CUDA, FlexAttention is
available and no attention dropout is active (FlexAttention has none), the core's other paths otherwise.
On CPU FlexAttention runs forward only (no backward): forcing ``"flex"`` there serves inference and the
tests that check it against the reference.

Cost beyond the kernel: a block mask is built per call (a sort and a dozen small kernels), or once per
length for unpadded inputs (:class:`BlockMaskCache`); each distinct pattern kind (core, dtype, batched or
shared mask) compiles once, and torch's recompile limit (``torch._dynamo.config.recompile_limit``, 8 by
default) caps how many one process compiles before FlexAttention falls back to its unfused kernel.

Shapes: b = batch, h = heads, n = sequence length, d = head_dim, nb = number of flex blocks.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable

import torch

try:
    from torch.nn.attention.flex_attention import BlockMask, flex_attention
except ImportError:  # torch without FlexAttention
    BlockMask = flex_attention = None

FLEX_BLOCK = 128  # tokens per BlockMask block (FlexAttention's default tile)
# The smallest head size FlexAttention's compiled CUDA kernel takes (torch's Inductor lowering refuses fewer
# with "NYI: embedding dimension ... must be at least 16"); "auto" takes the native path below it.
MIN_CUDA_HEAD_DIM = 16

MaskMod = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
ScoreMod = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def flex_unsupported(core, query: torch.Tensor, inputs) -> str | None:
    """Why FlexAttention cannot compute this call of ``core``, or None: a FlexAttention
    :class:`~hf_efficient.attention.base.Kernel`'s ``unsupported``."""
    if flex_attention is None:
        return "it needs torch.nn.attention.flex_attention (torch >= 2.5)"
    if inputs is not None and inputs.output_attentions:
        return "FlexAttention returns no attention weights"
    if core.training and core.spec.dropout > 0.0:
        return "FlexAttention has no attention dropout (set attention_probs_dropout_prob=0 to use it)"
    if query.is_cuda and query.shape[-1] < MIN_CUDA_HEAD_DIM:
        return (
            f"FlexAttention's CUDA kernel needs a head size of at least {MIN_CUDA_HEAD_DIM}, got "
            f"head_dim={query.shape[-1]} (hidden_size / num_attention_heads)"
        )
    if not query.is_cuda and torch.is_grad_enabled() and query.requires_grad:
        return "FlexAttention has no CPU backward (run inference under torch.no_grad(), or train on CUDA)"
    return None


# ``"auto"`` takes FlexAttention on CUDA (one fused kernel); on CPU its unfused fallback is slower than the
# native paths (a Kernel's ``devices``).
FLEX_DEVICES = frozenset({"cuda"})


def num_blocks(n: int, block: int = FLEX_BLOCK) -> int:
    return -(-n // block)


def block_ranges(n: int, block: int = FLEX_BLOCK, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """First and last token position of every block: (nb,), (nb,) (the last block may be short)."""
    first = torch.arange(0, n, block, device=device)
    return first, (first + block - 1).clamp(max=n - 1)


def blocks_holding(token_mask: torch.Tensor, block: int = FLEX_BLOCK) -> torch.Tensor:
    """(..., n) bool -> (..., nb): which blocks hold at least one True token."""
    n = token_mask.shape[-1]
    padded = torch.nn.functional.pad(token_mask, (0, (-n) % block))
    return padded.unflatten(-1, (-1, block)).any(-1)


def blocks_all(token_mask: torch.Tensor, block: int = FLEX_BLOCK) -> torch.Tensor:
    """(..., n) bool -> (..., nb): which blocks hold only True tokens (the short last block: its tokens)."""
    n = token_mask.shape[-1]
    padded = torch.nn.functional.pad(token_mask, (0, (-n) % block), value=True)
    return padded.unflatten(-1, (-1, block)).all(-1)


def flex_block_mask(
    partial: torch.Tensor,
    mask_mod: MaskMod,
    n: int,
    full: torch.Tensor | None = None,
    block: int = FLEX_BLOCK,
) -> BlockMask:
    """A ``BlockMask`` from block-level patterns (see the module docstring).

    Args:
        partial: (b|1, h|1, nb, nb) bool, block pairs that may hold an allowed (query, key) pair.
        mask_mod: the exact token-level pattern, applied inside partial blocks.
        n: sequence length (queries and keys).
        full: optional (b|1, h|1, nb, nb) bool, block pairs whose every pair is allowed; must imply partial.
    """
    full_args = {}
    if full is not None:
        partial = partial & ~full
        full_args = dict(zip(("full_kv_num_blocks", "full_kv_indices"), _kv_blocks(full), strict=True))
    kv_num_blocks, kv_indices = _kv_blocks(partial)
    return BlockMask.from_kv_blocks(
        kv_num_blocks, kv_indices, BLOCK_SIZE=block, mask_mod=mask_mod, seq_lengths=(n, n), **full_args
    )


def _kv_blocks(pattern: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, H, nq, nk) bool -> counts (B, H, nq) int32 and indices (B, H, nq, nk) int32, kept blocks first."""
    counts = pattern.sum(-1, dtype=torch.int32)
    order = torch.argsort((~pattern).to(torch.int8), dim=-1, stable=True)  # True blocks first, in order
    return counts, order.to(torch.int32)


def flex_attend(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: BlockMask,
    scale: float,
    score_mod: ScoreMod | None = None,
) -> torch.Tensor:
    """softmax(q k^T scale + score_mod) v over the block mask's pattern: (b, h, n, d).

    Compiled on CUDA (one fused kernel); on CPU the eager reference path (forward only). A query row with no
    allowed key outputs 0.
    """
    if query.is_cuda:
        return _compiled_flex()(query, key, value, score_mod=score_mod, block_mask=mask, scale=scale)
    with warnings.catch_warnings():  # "flex_attention called without torch.compile()": intended on CPU
        warnings.simplefilter("ignore", UserWarning)
        return flex_attention(query, key, value, score_mod=score_mod, block_mask=mask, scale=scale)


@functools.cache
def _compiled_flex():
    return torch.compile(flex_attention)


def coarsen(pattern: torch.Tensor, block: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Block-level patterns at ``FLEX_BLOCK`` from a pattern over blocks of ``block`` tokens.

    Args:
        pattern: (B, H, m, m) bool, which (query block, key block) pairs of ``block`` tokens are allowed.
        n: sequence length.

    Returns:
        partial, full: (B, H, nb, nb) bool: flex block pairs covering some / only allowed block pairs
        (counted with 2-D prefix sums, so any ratio of the two block sizes works).
    """
    m = pattern.shape[-1]
    first, last = block_ranges(n, device=pattern.device)
    lo, hi = first // block, (last // block).clamp(max=m - 1)  # (nb,): covered small blocks [lo, hi]
    sums = torch.nn.functional.pad(pattern.int().cumsum(-1).cumsum(-2), (1, 0, 1, 0))  # (B, H, m + 1, m + 1)
    row_hi, row_lo = (hi + 1)[:, None], lo[:, None]
    col_hi, col_lo = (hi + 1)[None, :], lo[None, :]
    count = (
        sums[..., row_hi, col_hi]
        - sums[..., row_lo, col_hi]
        - sums[..., row_hi, col_lo]
        + sums[..., row_lo, col_lo]
    )  # (B, H, nb, nb)
    area = (hi - lo + 1)[:, None] * (hi - lo + 1)[None, :]
    return count > 0, count == area


def dense_pattern(mask_mod: MaskMod, batch: int, heads: int, n: int, device=None) -> torch.Tensor:
    """(batch, heads, n, n) bool: ``mask_mod`` evaluated on every (query, key) pair (O(n^2): short sequences
    and tests only)."""
    index = torch.arange
    return mask_mod(
        index(batch, device=device)[:, None, None, None],
        index(heads, device=device)[None, :, None, None],
        index(n, device=device)[None, None, :, None],
        index(n, device=device)[None, None, None, :],
    ).expand(batch, heads, n, n)


def reduce_dense(allowed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, H, n, n) bool token pattern -> partial, full (B, H, nb, nb) at ``FLEX_BLOCK``."""
    n = allowed.shape[-1]
    extra = (-n) % FLEX_BLOCK
    padded_any = torch.nn.functional.pad(allowed, (0, extra, 0, extra))
    padded_all = torch.nn.functional.pad(allowed, (0, extra, 0, extra), value=True)
    nb = num_blocks(n)
    shape = (*allowed.shape[:2], nb, FLEX_BLOCK, nb, FLEX_BLOCK)
    return padded_any.view(shape).any(-1).any(-2), padded_all.view(shape).all(-1).all(-2)


class BlockMaskCache:
    """A core's block masks that depend on sizes only (no padding, no per-example tokens), by key.

    Building a block mask sorts block indices and launches a dozen small kernels, a fixed cost per call
    that matters next to a fused kernel of a few milliseconds; unpadded batches (the common case in
    pretraining and in benchmarks) reuse the mask of their length. Not saved with the model.
    """

    def __init__(self, capacity: int = 8):
        self.capacity, self.store = capacity, {}

    def get(self, key, build: Callable[[], BlockMask]) -> BlockMask:
        """The mask for ``key``, built once; ``key=None`` (per-batch data in the pattern) always builds."""
        if key is None:
            return build()
        if key not in self.store:
            if len(self.store) >= self.capacity:
                self.store.pop(next(iter(self.store)))  # the oldest
            self.store[key] = build()
        return self.store[key]


__all__ = [
    "FLEX_BLOCK",
    "FLEX_DEVICES",
    "BlockMaskCache",
    "block_ranges",
    "blocks_all",
    "blocks_holding",
    "flex_unsupported",
    "coarsen",
    "dense_pattern",
    "flex_attend",
    "flex_block_mask",
    "num_blocks",
    "reduce_dense",
]
