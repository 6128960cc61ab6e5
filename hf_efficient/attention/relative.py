"""Learned relative position scores, as BERT's ``position_embedding_type`` builds them: an input of a call
(:class:`RelativePositions`) that the cores declaring ``capabilities.relative_positions`` add to their scores.

Shaw et al. 2018 ("Self-Attention with Relative Position Representations", ``relative_key``) and Huang et al.
2020 ("Improve Transformer Models with Better Relative Position Embeddings", ``relative_key_query``): one
learned vector e_r per distance r = i - j between query position i and key position j (BERT's
``attention.self.distance_embedding``, 2 L - 1 rows for L = ``max_position_embeddings``, row r + L - 1 for
distance r), added to every score before the softmax:

    s_ij = (q_i . k_j + q_i . e_{i-j}) / sqrt(d)                    relative_key
    s_ij = (q_i . k_j + q_i . e_{i-j} + k_j . e_{i-j}) / sqrt(d)    relative_key_query

The scores depend on i - j only, so a core computes them for whatever (query, key) pairs its pattern forms:
the dense n x T matrix (``full``), the band of a sliding window and its global rows and columns
(``longformer``). A core that never forms per-pair scores (kernelized, low-rank, hashed) cannot add them and
refuses the input naming why (``AttentionCore.relative_positions_refusal``). The block that owns the table
(:class:`~hf_efficient.modeling.blocks.EfficientSelfAttention`) passes it with each call.

Shapes: b = batch, h = heads, n queries, T keys, d = head_dim, L = the table's maximum distance + 1.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# BERT's position_embedding_type values that build a distance table, and whether keys read it too.
RELATIVE_POSITION_TYPES = {"relative_key": False, "relative_key_query": True}


@dataclass(frozen=True)
class RelativePositions:
    """The distance embeddings of one layer, passed to its core in ``AttentionInputs.relative_positions``.

    Attributes:
        table: (2 L - 1, d), row r + L - 1 embeds the distance r = i - j (query minus key position), for
            |r| < L (BERT's ``distance_embedding.weight``).
        keys_too: ``relative_key_query``: the keys are dotted with the distance embedding too (Huang et al.'s
            method 4); False: ``relative_key``, the queries only (Shaw et al.).
    """

    table: torch.Tensor
    keys_too: bool = False

    @property
    def kind(self) -> str:
        """BERT's ``position_embedding_type`` name of these scores."""
        return "relative_key_query" if self.keys_too else "relative_key"

    def check(self, head_dim: int, name: str) -> None:
        """Raise unless the table is (2 L - 1, head_dim) (shapes only)."""
        rows = self.table.shape[0] if self.table.dim() == 2 else 0
        if self.table.dim() != 2 or self.table.shape[1] != head_dim or rows % 2 == 0:
            raise ValueError(
                f"{name}: relative_positions.table must have shape (2 * max_position_embeddings - 1, "
                f"head_dim={head_dim}), got {tuple(self.table.shape)}."
            )

    def scores(
        self, query: torch.Tensor, key: torch.Tensor, distance: torch.Tensor, scale: float
    ) -> torch.Tensor:
        """``scale * (q_i . e_{i-j} [+ k_j . e_{i-j}])`` for every (query, key) pair a core forms.

        Args:
            query: (..., n, d) queries, key: (..., T, d) keys (leading dimensions broadcast).
            distance: integer (..., n, T) query position minus key position of every pair (broadcast
                against the leading dimensions; pairs a core masks may hold any value: they are clipped
                into the table).
            scale: the core's score scale (1 / sqrt(d)).

        Returns:
            (..., n, T) scores to add to the core's (scaled) query-key scores.
        """
        reach = (self.table.shape[0] - 1) // 2  # L - 1
        embedded = self.table.to(query.dtype)[distance.clamp(-reach, reach) + reach]  # (..., n, T, d)
        scores = (query.unsqueeze(-2) @ embedded.transpose(-1, -2)).squeeze(-2)  # (..., n, T)
        if (
            self.keys_too
        ):  # k_j . e_{i-j}: the pairs of key j over the queries, (..., T, n, d) @ (..., T, d, 1)
            scores = scores + (embedded.transpose(-2, -3) @ key.unsqueeze(-1)).squeeze(-1).transpose(-1, -2)
        return scores * scale

    def position_scores(self, query, key, query_positions, key_positions, scale: float) -> torch.Tensor:
        """:meth:`scores` of queries (..., n, d) at ``query_positions`` (..., n) over keys (..., T, d) at
        ``key_positions`` (..., T) (integer, broadcast against the leading dimensions)."""
        key_positions = key_positions.to(query_positions.device)
        distance = query_positions[..., :, None] - key_positions[..., None, :]  # (..., n, T)
        return self.scores(query, key, distance, scale)


def band_scores(relative, queries, keys, offset, global_positions, r: int, scale: float) -> torch.Tensor:
    """:meth:`RelativePositions.scores` of Longformer's chunked window (its reference's layout): queries
    (B, h, chunks, c, d) over their keys (B, h, chunks, span + G, d), the span window keys then the G global
    ones. Window key f of query e lies ``offset[e, f]`` (c, span) after it in its residue mod r: at distance
    -offset r; global key g at ``global_positions`` (b, G). Row B of the batch is example B // r, residue
    B mod r; query e of chunk t sits at (t c + e) r + residue. Returns (B, h, chunks, c, span + G)."""
    span = offset.shape[1]
    window = relative.scores(queries, keys[..., :span, :], -offset * r, scale)  # (B, h, chunks, c, span)
    if global_positions.shape[1] == 0:
        return window
    rows, _, chunks, c, _ = queries.shape
    residue = torch.arange(rows, device=offset.device) % r
    positions = torch.arange(chunks * c, device=offset.device).view(chunks, c) * r + residue[:, None, None]
    global_positions = global_positions.repeat_interleave(r, dim=0)[:, None, None]  # (B, 1, 1, G)
    scores = relative.position_scores(
        queries, keys[..., span:, :], positions[:, None], global_positions, scale
    )
    return torch.cat([window, scores], dim=-1)


def offset_distances(n: int, total: int, device) -> torch.Tensor:
    """(n, total) distances i - j of the last n of ``total`` positions (queries) to all of them (keys): a
    prompt (n = total) or new tokens after a cache."""
    positions = torch.arange(total, device=device)
    return positions[total - n :, None] - positions[None, :]


__all__ = ["RELATIVE_POSITION_TYPES", "RelativePositions", "band_scores", "offset_distances"]
