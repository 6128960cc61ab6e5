"""Multi-hop diffusion attention over graph edges (MAGNA: Wang et al. 2021, Multi-hop Attention Graph
Neural Networks, IJCAI).

One-hop attention is graph-sparse attention (softmax over each node's incoming edges, see
:mod:`hf_efficient.attention.graph_sparse`): A[i, j] = p_ij for an edge j -> i, 0 elsewhere (per head).
MAGNA diffuses it over several hops with personalised-PageRank weights:

    out = sum_{k >= 0} theta_k A^k V,        theta_k = alpha (1 - alpha)^k,    sum_k theta_k = 1

computed, as in the paper, by K iterations over the edges, never forming A^k:

    Z_0 = V,    Z_{k+1} = (1 - alpha) A Z_k + alpha V,    out = Z_K
        = sum_{k < K} alpha (1 - alpha)^k A^k V + (1 - alpha)^K A^K V

so the truncated tail (1 - alpha)^K A^K V keeps the weights summing to 1; K -> infinity gives the exact
diffusion alpha (I - (1 - alpha) A)^{-1} V. Limits: alpha = 1 gives V; K = 1 gives
(1 - alpha) * graph_sparse + alpha V; K = 0 gives V.

Cost: O(K E h d) time, O(E h) for the one-hop probabilities plus K copies of (b, h, n, d) saved for the
backward (each hop is graph_sparse's CSR x dense product, with its custom backward). No (n x n) matrix.

Deviations from the paper:
    * one-hop scores are scaled dot products q_i . k_j / sqrt(d) (graph_sparse's, with its optional edge
      features and edge weights), where MAGNA uses GAT's concatenation scores with an edge-type vector;
    * the attention block around the core (layer norm, feed-forward) is the encoder's, not MAGNA's
      pre-norm "deep aggregation" block;
    * dropout (training only) is applied to the one-hop probabilities, once, shared by every hop;
    * a node without incoming edges keeps alpha v_i (its hops contribute nothing); padded queries output 0.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .base import AttentionCapabilities
from .graph_sparse import EdgePattern, GraphSparseAttention, GraphSparseConfig
from .registry import register_attention


@dataclass
class MultiHopConfig(GraphSparseConfig):
    """Hyperparameters of :class:`MultiHopAttention` (plus graph_sparse's ``edge_dim``/``edge_feature_mode``).

    Attributes:
        alpha: teleport probability of the personalised PageRank weights theta_k = alpha (1 - alpha)^k,
            in (0, 1]; 1 returns the values unchanged.
        num_hops: K, the number of diffusion iterations (>= 0); cost grows linearly with it.
    """

    alpha: float = 0.15
    num_hops: int = 4

    def validate(self) -> None:
        super().validate()
        if not 0.0 < self.alpha <= 1.0:
            raise ValueError(f"attention_config['alpha'] must be in (0, 1], got {self.alpha}.")
        if self.num_hops < 0:
            raise ValueError(f"attention_config['num_hops'] must be >= 0, got {self.num_hops}.")


@register_attention("multi_hop")
class MultiHopAttention(GraphSparseAttention):
    """Personalised-PageRank diffusion of graph-sparse attention, O(K E); see the module docstring."""

    config_class = MultiHopConfig
    capabilities = AttentionCapabilities(
        padding_mask=True,
        edges=True,
        requires_edges=True,
        permutation_equivariant=True,
        modalities=frozenset({"graph"}),
    )
    paper = "Wang et al. 2021, Multi-hop Attention Graph Neural Networks (MAGNA)"
    cost = "O(K·E)"
    summary = "one-hop attention over edges diffused K hops (personalised PageRank)"
    export_note = "as graph_sparse, K hops of scatters"
    small_config = {"alpha": 0.2, "num_hops": 3}

    @classmethod
    def forward_flops(cls, n, head_dim, config, num_edges=None):
        """2 E d + 2 K E d: one-hop scores, then K hops of A Z over the edges (E = 16 n unless given)."""
        edges = 16 * n if num_edges is None else num_edges
        return 2.0 * edges * head_dim * (1 + config.num_hops)

    def _edge_features(self, edges):
        try:
            return super()._edge_features(edges)
        except ValueError as err:  # graph_sparse's messages name graph_sparse; name this core instead
            raise ValueError(str(err).replace("graph_sparse", self.attention_type)) from None

    def _propagate(self, probs: torch.Tensor, value: torch.Tensor, pattern: EdgePattern) -> torch.Tensor:
        """Diffusion of the one-hop attention A (graph_sparse's, computed once and shared by every hop):
        Z <- (1 - alpha) A Z + alpha V, K times (each hop O(E h d)); (b, h, n, d) in and out."""
        alpha = self.config.alpha
        teleport = value * alpha  # (b, h, n, d)
        z = value
        for _ in range(self.config.num_hops):
            z = pattern.aggregate(probs, z) * (1.0 - alpha) + teleport  # (b, h, n, d)
        return z
