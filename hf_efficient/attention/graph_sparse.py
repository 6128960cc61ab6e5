"""Graph-sparse attention: softmax over a graph's edges only (Dwivedi & Bresson 2021, GAT-style neighbours).

Each node (a query) attends only to the sources of its incoming edges. For target i with in-neighbours N(i):

    s_ij = q_i . k_j / sqrt(d)                           (per head)
    s_ij <- s_ij * (W_E e_ij)_h    ("multiply", default: softmax(QK^T/sqrt(d) (.) A_G (.) W_E E) V)
         or s_ij + (W_E e_ij)_h    ("add", an edge bias)          only when edge_dim is set
    p_ij = w_ij exp(s_ij) / sum_{k in N(i)} w_ik exp(s_ik)        (w = optional positive edge weights)
    out_i = sum_{j in N(i)} p_ij v_j

Cost: O(E h d) time, O(E h) memory beyond the inputs with the ``"csr"`` kernel (O(E h d) for the
reference). The softmax over a target's edges, the weighted sum and the returned weights are the edge
machinery of :mod:`hf_efficient.attention._edge_attention` (reference) and
:mod:`hf_efficient.attention.kernels.edges` (``"csr"``: one sparse kernel call for all heads, custom
backward), which ``gat``, ``gatv2`` and ``multi_hop`` share; this module gives the scores.

Deviations from the paper:
    * the edge projection W_E (``Linear(edge_dim, heads)``) gives one scalar per head and edge (the lecture's
      form); the paper projects edges to d values per head, multiplies them into q (.) k before the sum,
      and also updates an edge stream, which this core does not produce;
    * the softmax subtracts the per-target maximum (exact, stable) instead of the paper's clamp to [-5, 5];
    * edge weights enter as log w_ij added to the scores (p_ij ∝ w_ij exp(s_ij)), not in the paper;
    * a node with no incoming edge (isolated, or padded) outputs 0; ``add_self_loops`` (off by default here,
      on for ``gat``/``gatv2`` as in PyG) gives every real node exactly one self loop.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ._edge_attention import EdgeAttention, EdgeAttentionConfig
from .kernels.edges import CSR_KERNEL
from .registry import register_attention

EDGE_FEATURE_MODES = ("multiply", "add")


@dataclass
class GraphSparseConfig(EdgeAttentionConfig):
    """Hyperparameters of :class:`GraphSparseAttention` (plus ``edge_dim`` and ``add_self_loops``).

    Attributes:
        edge_feature_mode: ``"multiply"`` scales each score by (W_E e)_h, ``"add"`` adds it.
    """

    edge_feature_mode: str = "multiply"

    def validate(self) -> None:
        super().validate()
        if self.edge_feature_mode not in EDGE_FEATURE_MODES:
            raise ValueError(
                f"attention_config['edge_feature_mode'] must be one of {EDGE_FEATURE_MODES}, "
                f"got {self.edge_feature_mode!r}."
            )


@register_attention("graph_sparse")
class GraphSparseAttention(EdgeAttention):
    """Attention restricted to graph edges, O(E) memory; see the module docstring for the maths."""

    config_class = GraphSparseConfig
    kernels = (CSR_KERNEL,)
    paper = "Dwivedi & Bresson 2021, A Generalization of Transformer Networks to Graphs"
    cost = "O(E)"
    summary = "softmax over a graph's edges, edge weights and edge features"
    export_note = "edges by gathers and scatters, O(E h d); edge values are trusted (not checked)"
    script_configs = {"graph": {"attention_config": {"edge_feature_mode": "multiply"}}}  # bond features scale

    @classmethod
    def forward_flops(cls, n, head_dim, config, num_edges=None):
        """4 E d: a score and a weighted value per edge (E = 16 n unless given)."""
        return 4.0 * (16 * n if num_edges is None else num_edges) * head_dim

    def __init__(self, spec, config: GraphSparseConfig | None = None):
        super().__init__(spec, config)
        edge_dim = self.config.edge_dim
        self.edge_projection = nn.Linear(edge_dim, spec.num_heads) if edge_dim is not None else None  # W_E
        self.init_weights()

    def init_weights(self) -> None:
        """W_E ~ N(0, 0.02); bias 1 for "multiply", 0 for "add", so training starts near plain attention."""
        if self.edge_projection is not None:
            nn.init.normal_(self.edge_projection.weight, std=0.02)
            nn.init.constant_(
                self.edge_projection.bias, 1.0 if self.config.edge_feature_mode == "multiply" else 0.0
            )

    def _edge_scores(self, query, key, pattern, edge_attr):
        return dot_product_scores(
            query, key, pattern, self.scaling, self.edge_projection, edge_attr, self.config.edge_feature_mode
        )


def dot_product_scores(
    query: torch.Tensor,
    key: torch.Tensor,
    pattern,
    scale: float,
    edge_projection: nn.Linear | None = None,
    edge_attr: torch.Tensor | None = None,
    mode: str = "multiply",
) -> torch.Tensor:
    """Scaled dot products q_i . k_j / sqrt(d) over the entries (E h,), times or plus (W_E e_ij)_h.
    ``pattern``: the reference's ``EdgeScatter`` or the kernel's ``EdgePattern``."""
    scores = pattern.dot_scores(query, key, scale)  # (E h,)
    if edge_attr is not None:
        weight = edge_projection.weight
        projected = pattern.to_entries(edge_projection(edge_attr.to(weight.dtype)).to(scores.dtype))  # (E h,)
        scores = scores * projected if mode == "multiply" else scores + projected
    return scores
