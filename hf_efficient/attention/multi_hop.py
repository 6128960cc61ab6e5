"""Multi-hop diffusion attention over graph edges (MAGNA: Wang et al. 2021, Multi-hop Attention Graph
Neural Networks, IJCAI).

One-hop attention A[i, j] = p_ij for an edge j -> i, 0 elsewhere (per head), is the softmax over each node's
incoming edges of a score chosen by ``score``:

    "gat" (MAGNA as published, its eq. 1: GAT's additive score on tanh-squashed projections)
        s_ij = LeakyReLU(a_dst . tanh(q_i) + a_src . tanh(k_j) + a_edge . tanh(W_e x_ij))
    "dot" (the Transformer's, ``graph_sparse``'s, with its edge features and modes)
        s_ij = q_i . k_j / sqrt(d)

MAGNA diffuses it over several hops with personalised-PageRank weights:

    out = sum_{k >= 0} theta_k A^k V,        theta_k = alpha (1 - alpha)^k,    sum_k theta_k = 1

computed, as in the paper, by K iterations over the edges, never forming A^k:

    Z_0 = V,    Z_{k+1} = (1 - alpha) A Z_k + alpha V,    out = Z_K
        = sum_{k < K} alpha (1 - alpha)^k A^k V + (1 - alpha)^K A^K V

so the truncated tail (1 - alpha)^K A^K V keeps the weights summing to 1; K -> infinity gives the exact
diffusion alpha (I - (1 - alpha) A)^{-1} V. Limits: alpha = 1 gives V; K = 1 gives
(1 - alpha) * one-hop attention + alpha V; K = 0 gives V.

Cost: O(K E h d) time, O(E h) for the one-hop probabilities plus K copies of (b, h, n, d) saved for the
backward (each hop is the shared edge machinery's weighted sum: with the ``"csr"`` kernel one CSR x dense
product over all heads, with its custom backward). No (n x n) matrix, except on request:
``output_attentions=True`` returns the diffused attention T = sum_{k < K} theta_k A^k + (1 - alpha)^K A^K
as a dense (b, h, n, n) tensor (O(K E h n) time, O(b h n^2) memory; for small graphs).

Deviations from the paper:
    * score "gat": the projections are the encoder block's (``query`` on the target, ``key`` on the source
      side, ``value`` the messages), where MAGNA's code ties them (one W) and its paper writes
      v_a tanh(W_h h_i ‖ W_t h_j ‖ W_r r_k), the same sum; edge features are projected by W_e
      (edge_dim -> h d, no bias) where MAGNA embeds knowledge-graph relation types;
    * the attention block around the core (layer norm, feed-forward) is the encoder's, not MAGNA's
      pre-norm "deep aggregation" block;
    * dropout (training only) is applied to the one-hop probabilities, once, shared by every hop (MAGNA's
      code draws a new mask at each hop);
    * a node without incoming edges keeps alpha v_i (its hops contribute nothing); padded queries output 0.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from ._edge_attention import EdgeAttention, from_slots, to_slots
from .gat import additive_scores
from .graph_sparse import GraphSparseConfig, dot_product_scores
from .kernels.edges import CSR_KERNEL
from .registry import register_attention

SCORES = ("gat", "dot")


@dataclass
class MultiHopConfig(GraphSparseConfig):
    """Hyperparameters of :class:`MultiHopAttention` (plus ``edge_dim``, ``add_self_loops`` and, for
    ``score="dot"``, graph_sparse's ``edge_feature_mode``).

    Attributes:
        alpha: teleport probability of the personalised PageRank weights theta_k = alpha (1 - alpha)^k,
            in (0, 1]; 1 returns the values unchanged.
        num_hops: K, the number of diffusion iterations (>= 0); cost grows linearly with it.
        score: the one-hop score, ``"dot"`` (scaled dot product, the default, what earlier versions
            computed) or ``"gat"`` (MAGNA's additive score, as published).
        negative_slope: LeakyReLU's slope in the ``"gat"`` score (MAGNA: 0.2).
    """

    alpha: float = 0.15
    num_hops: int = 4
    score: str = "dot"
    negative_slope: float = 0.2

    def validate(self) -> None:
        super().validate()
        if not 0.0 < self.alpha <= 1.0:
            raise ValueError(f"attention_config['alpha'] must be in (0, 1], got {self.alpha}.")
        if self.num_hops < 0:
            raise ValueError(f"attention_config['num_hops'] must be >= 0, got {self.num_hops}.")
        if self.score not in SCORES:
            raise ValueError(f"attention_config['score'] must be one of {SCORES}, got {self.score!r}.")
        if not (math.isfinite(self.negative_slope) and self.negative_slope >= 0):
            raise ValueError(
                f"attention_config['negative_slope'] must be a finite number >= 0, got {self.negative_slope}."
            )


@register_attention("multi_hop")
class MultiHopAttention(EdgeAttention):
    """Personalised-PageRank diffusion of one-hop attention over edges, O(K E); see the module docstring."""

    config_class = MultiHopConfig
    kernels = (CSR_KERNEL,)
    paper = "Wang et al. 2021, Multi-hop Attention Graph Neural Networks (MAGNA)"
    cost = "O(K·E)"
    summary = "one-hop attention over edges (dot or GAT scores) diffused K hops (personalised PageRank)"
    small_config = {"alpha": 0.2, "num_hops": 3}
    export_note = "as graph_sparse (gat score: as gat), K hops of scatters"
    script_configs = {"graph": {"attention_config": {"alpha": 0.15, "num_hops": 4, "score": "dot"}}}

    @classmethod
    def edge_traffic_bytes(cls, num_edges, hidden, num_heads, config, element_bytes=4):
        """One-hop attention's traffic (graph_sparse's; GAT's scores read fewer rows), then per hop one more
        row forward and two backward."""
        one_hop = super().edge_traffic_bytes(num_edges, hidden, num_heads, config, element_bytes)
        return one_hop + float(num_edges) * element_bytes * hidden * 3 * max(config.num_hops - 1, 0)

    @classmethod
    def forward_flops(cls, n, head_dim, config, num_edges=None):
        """2 E d + 2 K E d: one-hop scores, then K hops of A Z over the edges (E = 16 n unless given)."""
        edges = 16 * n if num_edges is None else num_edges
        return 2.0 * edges * head_dim * (1 + config.num_hops)

    def __init__(self, spec, config: MultiHopConfig | None = None):
        super().__init__(spec, config)
        h, d, edge_dim = spec.num_heads, spec.head_dim, self.config.edge_dim
        self.att_src = self.att_dst = self.att_edge = self.edge_projection = None
        if self.config.score == "gat":
            self.att_src = nn.Parameter(torch.empty(h, d))
            self.att_dst = nn.Parameter(torch.empty(h, d))
            if edge_dim is not None:
                self.edge_projection = nn.Linear(edge_dim, h * d, bias=False)  # W_e
                self.att_edge = nn.Parameter(torch.empty(h, d))
        elif edge_dim is not None:
            self.edge_projection = nn.Linear(edge_dim, h)  # graph_sparse's W_E
        self.init_weights()

    def init_weights(self) -> None:
        """ "gat": Glorot-uniform attention vectors and edge projection (as GAT); "dot": graph_sparse's
        W_E ~ N(0, 0.02) with bias 1 ("multiply") or 0 ("add")."""
        if self.config.score == "gat":
            for tensor in (self.att_src, self.att_dst, self.att_edge):
                if tensor is not None:
                    nn.init.xavier_uniform_(tensor)
            if self.edge_projection is not None:
                nn.init.xavier_uniform_(self.edge_projection.weight)
        elif self.edge_projection is not None:
            nn.init.normal_(self.edge_projection.weight, std=0.02)
            nn.init.constant_(
                self.edge_projection.bias, 1.0 if self.config.edge_feature_mode == "multiply" else 0.0
            )

    def _edge_scores(self, query, key, pattern, edge_attr):
        if self.config.score == "dot":
            return dot_product_scores(
                query,
                key,
                pattern,
                self.scaling,
                self.edge_projection,
                edge_attr,
                self.config.edge_feature_mode,
            )
        edge_term = None
        if edge_attr is not None:  # a_edge . tanh(W_e x), one value per edge and head
            h, d = self.num_heads, self.head_dim
            weight = self.edge_projection.weight
            projected = torch.tanh(self.edge_projection(edge_attr.to(weight.dtype))).view(-1, h, d)
            edge_term = pattern.to_entries((projected * self.att_edge).sum(-1).to(query.dtype))  # (E h,)
        return additive_scores(
            torch.tanh(query),
            torch.tanh(key),
            pattern,
            self.att_dst,
            self.att_src,
            self.config.negative_slope,
            edge_term,
        )

    def _propagate(self, probs: torch.Tensor, value: torch.Tensor, pattern) -> torch.Tensor:
        """Diffusion of the one-hop attention A (computed once and shared by every hop):
        Z <- (1 - alpha) A Z + alpha V, K times (each hop O(E h d)); (N h, d) slots in and out."""
        alpha = self.config.alpha
        teleport = value * alpha  # (N h, d)
        z = value
        for _ in range(self.config.num_hops):
            z = pattern.aggregate(probs, z) * (1.0 - alpha) + teleport  # (N h, d)
        return z

    def _attention_weights(self, probs, pattern, b: int, n: int) -> torch.Tensor:
        """The diffused attention T (b, h, n, n) dense: the diffusion applied to one-hot values."""
        h = self.num_heads
        eye = torch.eye(n, dtype=probs.dtype, device=probs.device)  # (n, n): node i's one-hot row
        values = eye[None, None].expand(b, h, n, n)  # (b, h, n, n): value of node j = e_j
        diffused = self._propagate(probs, to_slots(values), pattern)  # (N h, n): row i -> T[i, :]
        return from_slots(diffused, b, h, n)
