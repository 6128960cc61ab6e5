"""Graphormer's attention bias (Ying et al. 2021, Do Transformers Really Perform Bad for Graph
Representation?), computed once per forward and passed to every layer's exact attention as
``attention_bias``. Not an attention core: the attention is ``full`` (softmax(QK^T/sqrt(d) + B) V).

    B_ij = b_spatial[phi(i, j)]                                      (learned scalar per head and distance)
         + (1 / min(phi(i, j), H)) sum_{n < min(phi, H)} mean_{e in P_n(i, j)} (x_e W_n)   (edge encoding)

phi(i, j) is the shortest-path distance (``spatial_pos``, from
:func:`hf_efficient.data.graph_transforms.shortest_path_distances`): distances above ``max_spatial_distance``
share its bucket and unreachable pairs (-1) have a bucket of their own. P_n(i, j) is the set of edges
u -> v that are the n-th step of *some* shortest path from i to j, i.e. phi(i, u) = n and
phi(i, u) + 1 + phi(v, j) = phi(i, j); x_e is the edge's feature row and W_n a learned (edge_dim, heads)
matrix per hop (H = ``max_edge_hops``, Graphormer's ``multi_hop_max_dist``). With a virtual graph token the
bias gains a first row and column holding one learned scalar per head (``virtual_distance``).

Deviation: Graphormer averages along the one shortest path its Floyd-Warshall pre-processing happens to
keep, which depends on node order; here each hop averages over every edge that can be that hop of a
shortest path. The two agree whenever the shortest path is unique, and this form is permutation-equivariant.
Edge features are floats through a linear map (one-hot categorical features to get Graphormer's
embeddings). The layers around the attention are this package's post-LayerNorm blocks (Graphormer is
pre-LayerNorm). The edge encoding reads edges in their stored direction: store both directions of an
undirected graph (OGB does).

Cost: the edge encoding builds an (E, n, n) boolean "edge on a shortest path" tensor, O(E n^2) for a batch
with E edges in all and n nodes per graph: fine for molecules, too much for graphs of thousands of nodes.
"""

from __future__ import annotations

import torch
from torch import nn

from ...attention.inputs import is_tracing

EDGE_ENCODING_NOT_TRACEABLE = (
    "graph_bias='graphormer' with edge features (edge_dim set) cannot be traced by torch.export / "
    "torch.compile: the edge encoding lists the (edge, i, j) steps of shortest paths with nonzero, whose "
    "count is a value of the graph. Export Graphormer without edge features (edge_dim=None: spatial and "
    "virtual-token bias), or attention over edges (graph_sparse with edge_dim)."
)


class GraphormerAttentionBias(nn.Module):
    """Spatial + edge + virtual-token bias: (spatial_pos, edges) -> (b, heads, n', n'), n' = n (+1 with a
    virtual token)."""

    # Edge chunk size for the shortest-path test: about this many (edge, i, j) triples at once.
    chunk_elements: int = 2**21

    def __init__(self, config):
        super().__init__()
        heads = config.num_attention_heads
        self.max_distance = config.max_spatial_distance
        self.max_hops = config.max_edge_hops
        self.num_heads = heads
        # buckets 0..max_distance, then one for unreachable pairs
        self.spatial_embedding = nn.Embedding(config.max_spatial_distance + 2, heads)
        self.edge_encoder = (
            nn.Linear(config.edge_dim, config.max_edge_hops * heads) if config.edge_dim is not None else None
        )  # W_n for every hop n, stacked: (edge_dim) -> (hops * heads)
        self.virtual_distance = nn.Embedding(1, heads) if config.add_virtual_token else None

    def forward(
        self,
        spatial_pos: torch.Tensor,
        edge_index: torch.Tensor | None = None,
        edge_attr: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Build the bias.

        Args:
            spatial_pos: (b, n, n) int hop counts, -1 for unreachable (and padded) pairs.
            edge_index: (2, E) edges over the flattened (b * n) node positions (needed with edge features).
            edge_attr: (E, edge_dim) float edge features.

        Returns:
            (b, heads, n', n') additive attention bias.
        """
        unreachable = spatial_pos < 0
        buckets = spatial_pos.clamp(0, self.max_distance).masked_fill(unreachable, self.max_distance + 1)
        bias = self.spatial_embedding(buckets)  # (b, n, n, h)
        if self.edge_encoder is not None:
            bias = bias + self._edge_encoding(spatial_pos, edge_index, edge_attr)
        bias = bias.permute(0, 3, 1, 2)  # (b, n, n, h) -> (b, h, n, n)
        if self.virtual_distance is None:
            return bias
        b, h, n, _ = bias.shape
        t = self.virtual_distance.weight.view(1, h, 1, 1)  # learned scalar per head
        bias = torch.cat([t.expand(b, h, n, 1), bias], dim=-1)  # node -> virtual token: t
        return torch.cat([t.expand(b, h, 1, n + 1), bias], dim=-2)  # virtual token -> everything: t

    def _edge_encoding(self, spatial_pos, edge_index, edge_attr) -> torch.Tensor:
        """(b, n, n, h) mean over hops of the mean encoding of the edges at that hop of shortest paths."""
        if edge_index is None or edge_attr is None:
            raise ValueError(
                "Graphormer's edge encoding (edge_dim is set) needs edge_index and edge_attr; pass them, "
                "or set edge_dim=None."
            )
        if is_tracing():
            raise ValueError(EDGE_ENCODING_NOT_TRACEABLE)
        b, n, _ = spatial_pos.shape
        h, hops = self.num_heads, self.max_hops
        spatial_pos = spatial_pos.to(torch.int32)
        graph, edge, i, j, hop = self._shortest_path_steps(spatial_pos, edge_index)  # (M,) each
        encoded = self.edge_encoder(edge_attr.to(self.edge_encoder.weight.dtype))  # (E, H * h)
        encoded = encoded.view(-1, hops, h)  # (E, H, h): x_e W_n for every hop n
        index = (graph, i, j, hop)
        sums = encoded.new_zeros(b, n, n, hops, h).index_put(index, encoded[edge, hop], accumulate=True)
        ones = encoded.new_ones(hop.shape)
        counts = encoded.new_zeros(b, n, n, hops).index_put(index, ones, accumulate=True)  # edges per hop
        per_hop = sums / counts.clamp(min=1)[..., None]  # (b, n, n, H, h): mean over the edges of each hop
        length = spatial_pos.clamp(1, hops).to(per_hop.dtype)[..., None]  # (b, n, n, 1)
        return per_hop.sum(3) / length  # (b, n, n, h)

    def _shortest_path_steps(
        self, spatial_pos: torch.Tensor, edge_index: torch.Tensor
    ) -> tuple[torch.Tensor, ...]:
        """Every (graph, edge e = u -> v, i, j, hop) with e the hop-th step (hop < H) of a shortest i -> j
        path: phi(i, u) = hop and phi(i, u) + 1 + phi(v, j) = phi(i, j). Edges are processed in chunks so
        that the (chunk, n, n) comparison stays near ``chunk_elements`` whatever the batch."""
        n = spatial_pos.shape[1]
        source, target = edge_index  # (E,) flat positions g * n + i
        graph = source // n  # (E,)
        chunk = max(1, self.chunk_elements // (n * n))
        found = [tuple(source.new_zeros(0) for _ in range(5))]  # nothing found yet (or no edges at all)
        for start in range(0, source.numel(), chunk):
            g, u, v = (
                graph[start : start + chunk],
                source[start : start + chunk] % n,
                target[start : start + chunk] % n,
            )
            from_i = spatial_pos[g, :, u]  # (c, n): phi(i, u) for every i
            to_j = spatial_pos[g, v, :]  # (c, n): phi(v, j) for every j
            on_path = from_i[:, :, None] + 1 + to_j[:, None, :] == spatial_pos[g]  # (c, n, n)
            on_path &= ((from_i >= 0) & (from_i < self.max_hops))[:, :, None] & (to_j >= 0)[:, None, :]
            edge, i, j = on_path.nonzero(as_tuple=True)  # (m,) each, edge relative to the chunk
            found.append((g[edge], edge + start, i, j, from_i[edge, i].long()))
        return tuple(torch.cat(parts) for parts in zip(*found, strict=True))
