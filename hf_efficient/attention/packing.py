"""Packed sequences: several sequences one after another along one row of T tokens, with no padding.

A padding-free encoder runs its embeddings, projections and feed-forward layers on the T real tokens of a
padded batch (the unpadded stream); transformers' ``DataCollatorWithFlattening`` packs examples into one row
whose ``position_ids`` restart at 0. Either way attention must not cross from one sequence into the next.
:class:`PackedSequences` says where each sequence starts (``cu_seqlens``, FlashAttention's convention) and
moves per-token tensors between the stream and a padded batch.

Every attention core serves a packed stream (:meth:`AttentionCore.forward`): a core that attends along a
graph's edges reads the stream as it is (edges never join two graphs); every other core computes each
sequence as if it ran alone, either one call per sequence on its own tokens (long sequences: no padding is
computed at all, the cost is the sum of each sequence's cost) or one call on the sequences padded to the
longest (many short ones: fewer, larger calls). Both give every sequence exactly its outputs alone.

Shapes: B = sequences, T = tokens in all, L = the longest sequence, h = heads, d = head_dim.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import torch

# At or above this longest length a packed call runs one core call per sequence; below it, one call on the
# sequences padded to the longest. Per-sequence calls compute no padding, but cost a call each: for short
# sequences the call overhead outweighs the padding (molecules of 9-50 atoms in batches of hundreds).
LOOP_MIN_LENGTH = 128


@dataclass(frozen=True, eq=False)
class PackedSequences:
    """Where B sequences sit along a packed row of T tokens.

    Attributes:
        cu_seqlens: (B + 1,) int64 cumulative lengths on the tokens' device: sequence s holds tokens
            ``cu_seqlens[s] .. cu_seqlens[s + 1] - 1``; ``cu_seqlens[0] == 0``, ``cu_seqlens[-1] == T``.
        lengths: the B lengths on the host (splitting and looping need them without a device sync).
    """

    cu_seqlens: torch.Tensor
    lengths: tuple[int, ...]

    def __post_init__(self):
        if not self.lengths or min(self.lengths) < 1:
            raise ValueError(
                "PackedSequences: every packed sequence needs at least one token, got lengths "
                f"{self.lengths}."
            )
        if self.cu_seqlens.shape != (len(self.lengths) + 1,):
            raise ValueError(
                f"PackedSequences: cu_seqlens must have shape (B + 1,) = ({len(self.lengths) + 1},), got "
                f"{tuple(self.cu_seqlens.shape)}."
            )

    @classmethod
    def from_lengths(cls, lengths, device: torch.device | str | None = None) -> PackedSequences:
        lengths = tuple(int(length) for length in lengths)
        cu = torch.tensor((0, *lengths), dtype=torch.long, device=device).cumsum(0)
        return cls(cu, lengths)

    @classmethod
    def from_cu_seqlens(cls, cu_seqlens: torch.Tensor) -> PackedSequences:
        """From FlashAttention's (B + 1,) cumulative lengths (read once on the host)."""
        cu = cu_seqlens.long()
        if cu.dim() != 1 or cu.numel() < 2 or int(cu[0]) != 0 or bool((cu[1:] <= cu[:-1]).any()):
            raise ValueError(
                "cu_seqlens must be a (B + 1,) tensor of cumulative lengths: 0 first, strictly increasing "
                f"(every sequence has a token), got {cu.tolist()}."
            )
        return cls(cu, tuple(cu.diff().tolist()))

    @classmethod
    def from_position_ids(cls, position_ids: torch.Tensor) -> PackedSequences:
        """From the (1, T) ``position_ids`` of a packed row (``DataCollatorWithFlattening``'s): a sequence
        starts wherever the position is 0."""
        positions = position_ids.reshape(-1)
        if position_ids.dim() != 2 or position_ids.shape[0] != 1 or int(positions[0]) != 0:
            raise ValueError(
                "position_ids of a packed row must have shape (1, T) and start at 0 (each packed sequence's "
                f"positions restart at 0), got shape {tuple(position_ids.shape)} starting at "
                f"{int(positions[0]) if positions.numel() else None}."
            )
        starts = (positions == 0).nonzero().reshape(-1)
        end = torch.tensor([positions.numel()], device=positions.device)
        packed = cls.from_cu_seqlens(torch.cat([starts, end]))
        token_starts = packed.cu_seqlens[packed.sequence_index()]  # (T,) where each token's sequence starts
        within = torch.arange(packed.total, device=positions.device) - token_starts
        if not bool((within == positions).all()):
            raise ValueError(
                "position_ids of a packed row must count 0, 1, 2, ... within each packed sequence "
                "(DataCollatorWithFlattening's); these restart at 0 but skip or repeat positions elsewhere."
            )
        return packed

    @property
    def num_sequences(self) -> int:
        return len(self.lengths)

    @property
    def total(self) -> int:
        return sum(self.lengths)

    @property
    def max_length(self) -> int:
        return max(self.lengths)

    def runs_per_sequence(self) -> bool:
        """One core call per sequence (True) or one call on the padded sequences (see LOOP_MIN_LENGTH)."""
        return self.num_sequences == 1 or self.max_length >= LOOP_MIN_LENGTH

    # The index tensors below are built once per instance (the model builds one per forward and every layer
    # reads it): at a batch of small sequences (16 molecules, 240 atoms) building them in each layer's
    # attention was a share of the step that padding-free removes nowhere else.
    def sequence_index(self) -> torch.Tensor:
        """(T,) the sequence of each token."""
        return self._sequence_index

    def padded_index(self) -> torch.Tensor:
        """(T,) each token's flat position in the (B * L) positions of the padded batch."""
        return self._padded_index

    def padding_mask(self) -> torch.Tensor:
        """(B, L) bool, True at the real tokens of the padded batch."""
        return self._padding_mask

    @cached_property
    def _sequence_index(self) -> torch.Tensor:
        counts = torch.tensor(self.lengths, device=self.cu_seqlens.device)
        return torch.repeat_interleave(torch.arange(self.num_sequences, device=counts.device), counts)

    @cached_property
    def _padded_index(self) -> torch.Tensor:
        sequence = self._sequence_index
        within = torch.arange(self.total, device=sequence.device) - self.cu_seqlens[sequence]
        return sequence * self.max_length + within

    @cached_property
    def _padding_mask(self) -> torch.Tensor:
        lengths = torch.tensor(self.lengths, device=self.cu_seqlens.device)
        return torch.arange(self.max_length, device=lengths.device)[None] < lengths[:, None]

    def split(self, x: torch.Tensor, dim: int) -> tuple[torch.Tensor, ...]:
        """The sequences of ``x`` along ``dim`` (the stream's token axis): B views."""
        return x.split(self.lengths, dim=dim)

    def to_padded(self, x: torch.Tensor) -> torch.Tensor:
        """(1, h, T, d) heads of the stream -> (B, h, L, d), zeros at padding."""
        _, h, t, d = x.shape
        tokens = x[0].transpose(0, 1)  # (T, h, d)
        padded = tokens.new_zeros(self.num_sequences * self.max_length, h, d)
        padded = padded.index_copy(0, self.padded_index(), tokens)
        return padded.view(self.num_sequences, self.max_length, h, d).transpose(1, 2)

    def from_padded(self, y: torch.Tensor) -> torch.Tensor:
        """(B, h, L, d) -> (1, h, T, d): the real tokens back in stream order."""
        b, h, length, d = y.shape
        tokens = y.transpose(1, 2).reshape(b * length, h, d)[self.padded_index()]  # (T, h, d)
        return tokens.transpose(0, 1)[None]

    def row_to_padded(self, x: torch.Tensor) -> torch.Tensor:
        """A (1, T, ...) packed row (ids, embeddings) -> (B, L, ...), zeros at padding."""
        tokens = x[0]  # (T, ...)
        padded = tokens.new_zeros(self.num_sequences * self.max_length, *tokens.shape[1:])
        padded = padded.index_copy(0, self.padded_index(), tokens)
        return padded.view(self.num_sequences, self.max_length, *tokens.shape[1:])

    def mask_to_padded(self, x: torch.Tensor) -> torch.Tensor:
        """A (1, T) per-token mask of the stream (global tokens) -> (B, L), False at padding."""
        padded = x.new_zeros(self.num_sequences * self.max_length)
        padded = padded.index_copy(0, self.padded_index(), x.reshape(-1))
        return padded.view(self.num_sequences, self.max_length)


__all__ = ["LOOP_MIN_LENGTH", "PackedSequences"]
