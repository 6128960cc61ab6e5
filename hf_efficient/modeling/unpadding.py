"""Padding-free encoders: a padded batch's real tokens as one packed stream, and back.

A padded batch spends its embeddings, projections, feed-forward layers and norms on padding. A padding-free
encoder gathers the T real tokens of a (b, n) batch into one (1, T) stream, runs every layer on it (attention
within each sequence: :class:`~hf_efficient.attention.packing.PackedSequences`) and scatters the outputs back
to (b, n, ...), zeros at padding. Every real token's output equals the padded computation's, for a
right-padded batch (every tokenizer's default): there each sequence's tokens keep their positions, so
windows, blocks, global token indices and length projections see what they see in the padded batch. A batch
padded otherwise (on the left, for generation; or with gaps) runs padded: the same outputs, at the padded
cost.

Shapes: b = batch, n = padded length, T = real tokens, D = hidden_size.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..attention.inputs import is_tracing
from ..attention.packing import PackedSequences


@dataclass(frozen=True, eq=False)
class UnpaddedBatch:
    """The real tokens of a padded (b, n) batch as a packed stream.

    Attributes:
        packed: the stream's sequences (rows without a real token left out).
        indices: (T,) the real tokens' flat positions in the b * n positions, row by row.
        shape: (b, n) of the padded batch.
    """

    packed: PackedSequences
    indices: torch.Tensor
    shape: tuple[int, int]

    @classmethod
    def from_mask(cls, attention_mask: torch.Tensor) -> UnpaddedBatch | None:
        """From a (b, n) 0/1 padding mask; None unless every row's real tokens come first (right padding)."""
        mask = attention_mask.bool()
        b, n = mask.shape
        lengths = mask.sum(-1)  # (b,)
        if not bool((torch.arange(n, device=mask.device)[None] < lengths[:, None]).eq(mask).all()):
            return None
        kept = [length for length in lengths.tolist() if length]
        indices = mask.reshape(-1).nonzero().reshape(-1)
        return cls(PackedSequences.from_lengths(kept, mask.device), indices, (b, n))

    @property
    def num_tokens(self) -> int:
        return self.indices.numel()

    def gather(self, x: torch.Tensor | None) -> torch.Tensor | None:
        """(b, n, ...) or (1 | b, n) per-token values -> (1, T, ...), the real tokens in stream order."""
        if x is None:
            return None
        b, n = self.shape
        if x.shape[0] == 1 and b > 1:
            x = x.expand(b, *x.shape[1:])
        return x.reshape(b * n, *x.shape[2:])[self.indices][None]

    def scatter(self, y: torch.Tensor) -> torch.Tensor:
        """(1, T, ...) -> (b, n, ...), zeros at padding."""
        b, n = self.shape
        out = y.new_zeros(b * n, *y.shape[2:])
        return out.index_copy(0, self.indices, y[0]).view(b, n, *y.shape[2:])


def unpadded_batch(attention_mask: torch.Tensor | None, enabled: bool) -> UnpaddedBatch | None:
    """The batch's real tokens as a stream when a padding-free run pays and is exact (``enabled``, something
    is padded, on the right; not while tracing: the stream's length follows the data); None: run padded."""
    if not enabled or attention_mask is None or is_tracing():
        return None
    if bool(attention_mask.bool().all()):
        return None  # nothing to remove
    return UnpaddedBatch.from_mask(attention_mask)


__all__ = ["UnpaddedBatch", "unpadded_batch"]
