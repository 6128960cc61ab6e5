"""Graph attention networks: GAT (Velickovic et al. 2018) and GATv2 (Brody et al. 2022) behind the contract,
numerically equal to PyG's ``GATConv`` / ``GATv2Conv`` given the same weights (see "Mapping onto PyG").

Both score each edge j -> i with a small additive network instead of a dot product, then take the softmax
over i's incoming edges and the weighted sum of values, exactly as ``graph_sparse`` (whose pattern, softmax,
aggregation and returned weights they share, :class:`~hf_efficient.attention._edge_attention.EdgeAttention`).
Per head, with W_q h_i = q_i (target side), W_k h_j = k_j (source side), v_j the message:

    GAT:    e_ij = LeakyReLU(a_dst . q_i + a_src . k_j + (W_e x_ij)_h)
    GATv2:  e_ij = a . LeakyReLU(q_i + k_j + (W_e x_ij)_h)                (W_e x_ij: d values per head)
    p_ij = w_ij exp(e_ij) / sum_{k in N(i)} w_ik exp(e_ik),     out_i = sum_{j in N(i)} p_ij v_j

GAT's score is a sum of a target term and a source term, so it ranks every neighbour of every node the same
way ("static" attention); GATv2 applies the nonlinearity before the attention vector, so the ranking depends
on the query ("dynamic" attention, Brody et al.'s point). Against dot-product attention (``graph_sparse``,
the Transformer's q_i . k_j / sqrt(d)), GAT's score is additive and needs no scaling.

Cost: O(E h) for GAT's scores (the two per-node products a . q and a . k are O(n h d), then one gather and
add per edge) and O(E h d) for GATv2's (a d-vector per edge and head); the weighted sum is O(E h d) for both.
Memory O(E h) beyond the inputs with the ``"csr"`` kernel (GATv2's vectors in chunks over edges, recomputed
in the backward pass, so no (E, h, d) tensor is kept: ``kernels.edges.GATv2Scores``); the reference keeps
the gathered (E, h d) rows.

Mapping onto PyG (what the parity tests check, float32 to 1e-5, forward and gradients):
    * the encoder block owns the projections (BERT's names): ``query`` is the target-side W (PyG's
      ``lin_dst`` / GATv2's ``lin_r``), ``key`` the source-side W used in the score (``lin_src`` / ``lin_l``)
      and ``value`` the messages' W (``lin_src`` / ``lin_l``). PyG's ``GATConv(in, out)`` ties all three
      (``lin``); ``GATv2Conv`` ties key and value (``lin_l``) unless ``share_weights``, which ties all three.
      Untied here: a checkpoint of any type warm-starts these cores, and tying them is a choice of weights;
    * PyG's output ``bias`` is the value projection's bias (each row of p sums to 1, so a constant added to
      every v_j is added to out_i); GATv2's ``lin_l`` / ``lin_r`` biases are the key / query biases (and
      ``lin_l``'s bias is added to the value bias). PyG's GAT projection has no bias; the block's query and
      key biases add a . b inside the LeakyReLU (zero them to reproduce ``GATConv``);
    * the core's own parameters: ``att_dst``, ``att_src`` (GAT) or ``att`` (GATv2), (h, d) each, and with
      ``edge_dim`` the edge projection. GATv2's is PyG's ``lin_edge`` (edge_dim -> h d, no bias). GAT's
      PyG form, a . (W_e x) with ``lin_edge`` (edge_dim -> h d) and ``att_edge`` (h, d), is one linear map
      edge_dim -> h, stored as such (``edge_projection.weight[hh] = att_edge[hh] @ lin_edge[hh]``): the same
      function with fewer parameters;
    * self loops: ``add_self_loops`` (default True, as PyG) removes the graph's self loops and adds one per
      real node, with edge features the mean of the node's incoming edges' (PyG's ``fill_value="mean"``);
    * dropout (``attention_probs_dropout_prob``) on the probabilities in training, as PyG's ``dropout``;
    * heads are concatenated (PyG's ``concat=True``); the output projection, residual and LayerNorm are the
      encoder block's; PyG's ``residual`` option is the block's residual connection.

Beyond PyG: positive edge weights (p_ij ∝ w_ij exp(e_ij)), padded batches, ``output_attentions`` as a
sparse (b, h, n, n) tensor of per-edge probabilities (PyG's ``return_attention_weights``). Deviations from
the papers: GAT's original model applies ELU between layers and averages heads in the output layer; here the
encoder block (output projection, feed-forward) follows. The ``"csr"`` kernel's backward is
once-differentiable; while tracing, ``"auto"`` takes the reference (``_edge_attention``'s ``EdgeScatter``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial

import torch
import torch.nn.functional as F
from torch import nn

from ._edge_attention import EdgeAttention, EdgeAttentionConfig
from .base import Kernel
from .kernels.edges import CSR_KERNEL, GATv2Scores, attend_csr
from .registry import register_attention


@dataclass
class GATConfig(EdgeAttentionConfig):
    """Hyperparameters of :class:`GATAttention` and :class:`GATv2Attention` (plus ``edge_dim``).

    Attributes:
        negative_slope: LeakyReLU's slope for negative inputs (PyG and the papers: 0.2), >= 0.
        add_self_loops: True by default, as PyG (see
            :class:`~hf_efficient.attention._edge_attention.EdgeAttentionConfig`).
    """

    add_self_loops: bool = True
    negative_slope: float = 0.2

    def validate(self) -> None:
        super().validate()
        if not (math.isfinite(self.negative_slope) and self.negative_slope >= 0):
            raise ValueError(
                f"attention_config['negative_slope'] must be a finite number >= 0, got {self.negative_slope}."
            )


def additive_scores(
    query: torch.Tensor,
    key: torch.Tensor,
    pattern,
    att_dst: torch.Tensor,
    att_src: torch.Tensor,
    negative_slope: float,
    edge_term: torch.Tensor | None = None,
) -> torch.Tensor:
    """GAT's scores LeakyReLU(a_dst . q_i + a_src . k_j + edge_term) over the entries (E h,).

    Args:
        query, key: (N h, d) slot matrices (target and source side).
        att_dst, att_src: (h, d) attention vectors.
        edge_term: (E h,) per-entry additions in entry order, or None.
    """
    h, d = att_dst.shape
    target_term = (query.view(-1, h, d) * att_dst).sum(-1).reshape(-1)  # (N h,) a_dst . q_i
    source_term = (key.view(-1, h, d) * att_src).sum(-1).reshape(-1)  # (N h,) a_src . k_j
    scores = pattern.per_entry(target_term) + pattern.source_slot_values(source_term)  # (E h,)
    if edge_term is not None:
        scores = scores + edge_term
    return F.leaky_relu(scores, negative_slope)


class _AdditiveEdgeAttention(EdgeAttention):
    """What GAT and GATv2 share: config, self loops, checks; only the score differs."""

    config_class = GATConfig
    kernels = (CSR_KERNEL,)
    # GAT's scores gather per-node scalars only: the rows read are v_j (sum), and in backward g_i (grad v)
    # and v_j (grad p). GATv2 adds q_i and k_j twice (forward, recomputed in backward) and scatters the
    # gradient of z into q and k (read-modify-write: 2 more each).
    edge_rows_read = 3

    @classmethod
    def forward_flops(cls, n, head_dim, config, num_edges=None):
        """2 E d + 4 n d: the weighted sum over the edges and the two per-node products a . q, a . k."""
        edges = 16 * n if num_edges is None else num_edges
        return 2.0 * edges * head_dim + 4.0 * n * head_dim


@register_attention("gat")
class GATAttention(_AdditiveEdgeAttention):
    """GAT's additive attention over edges, O(E); see the module docstring (and PyG's ``GATConv``)."""

    paper = "Velickovic et al. 2018, Graph Attention Networks"
    cost = "O(E)"
    summary = "additive scores LeakyReLU(a . [W h_i ‖ W h_j]) over a graph's edges (PyG GATConv)"
    export_note = "as graph_sparse, self loops on every node slot (padded slots' masked out)"
    script_configs = {"graph": {"attention_config": {"negative_slope": 0.2, "add_self_loops": True}}}

    def __init__(self, spec, config: GATConfig | None = None):
        super().__init__(spec, config)
        h, d = spec.num_heads, spec.head_dim
        self.att_src = nn.Parameter(torch.empty(h, d))  # a_src, read with the keys (sources)
        self.att_dst = nn.Parameter(torch.empty(h, d))  # a_dst, read with the queries (targets)
        edge_dim = self.config.edge_dim
        self.edge_projection = nn.Linear(edge_dim, h, bias=False) if edge_dim is not None else None
        self.init_weights()

    def init_weights(self) -> None:
        """Glorot-uniform attention vectors and edge projection, as PyG."""
        nn.init.xavier_uniform_(self.att_src)
        nn.init.xavier_uniform_(self.att_dst)
        if self.edge_projection is not None:
            nn.init.xavier_uniform_(self.edge_projection.weight)

    def _edge_scores(self, query, key, pattern, edge_attr):
        edge_term = None
        if edge_attr is not None:
            weight = self.edge_projection.weight
            edge_term = pattern.to_entries(self.edge_projection(edge_attr.to(weight.dtype)).to(query.dtype))
        return additive_scores(
            query, key, pattern, self.att_dst, self.att_src, self.config.negative_slope, edge_term
        )


def _chunked_scores(core: GATv2Attention, query, key, pattern, edge_attr) -> torch.Tensor:
    """GATv2's scores through the chunked :class:`~hf_efficient.attention.kernels.edges.GATv2Scores`."""
    nodes = query.shape[0] // core.num_heads
    scores = GATv2Scores.apply(
        query.reshape(nodes, -1),  # slots (N h, d) are node-major (N, h d) rows
        key.reshape(nodes, -1),
        core._edge_term(edge_attr, query.dtype),
        core.att,
        pattern,
        core.config.negative_slope,
    )  # (E, h) in the pattern's edge order
    return pattern.to_entries(scores)


@register_attention("gatv2")
class GATv2Attention(_AdditiveEdgeAttention):
    """GATv2's dynamic attention over edges, O(E d); see the module docstring (and PyG's ``GATv2Conv``)."""

    kernels = (Kernel("csr", partial(attend_csr, scores=_chunked_scores)),)
    paper = "Brody et al. 2022, How Attentive are Graph Attention Networks?"
    cost = "O(E)"
    edge_rows_read = 11
    summary = "dynamic additive scores a . LeakyReLU(W [h_i ‖ h_j]) over a graph's edges (PyG GATv2Conv)"
    export_note = "as gat, the (E, h d) sums unchunked (O(E h d) memory)"
    script_configs = {"graph": {"attention_config": {"negative_slope": 0.2, "add_self_loops": True}}}

    @classmethod
    def forward_flops(cls, n, head_dim, config, num_edges=None):
        """4 E d: a . LeakyReLU(z) and the weighted value per edge (E = 16 n unless given)."""
        return 4.0 * (16 * n if num_edges is None else num_edges) * head_dim

    def __init__(self, spec, config: GATConfig | None = None):
        super().__init__(spec, config)
        h, d = spec.num_heads, spec.head_dim
        self.att = nn.Parameter(torch.empty(h, d))  # a
        edge_dim = self.config.edge_dim
        self.edge_projection = nn.Linear(edge_dim, h * d, bias=False) if edge_dim is not None else None
        self.init_weights()

    def init_weights(self) -> None:
        """Glorot-uniform attention vector and edge projection, as PyG."""
        nn.init.xavier_uniform_(self.att)
        if self.edge_projection is not None:
            nn.init.xavier_uniform_(self.edge_projection.weight)

    def _edge_term(self, edge_attr: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
        """W_e x_ij, (E, h d) in the pattern's edge order; None without edge features."""
        if edge_attr is None:
            return None
        return self.edge_projection(edge_attr.to(self.edge_projection.weight.dtype)).to(dtype)

    def _edge_scores(self, query, key, pattern, edge_attr):
        """a . LeakyReLU(q_i + k_j + W_e x_ij) per edge and head, all edges at once: (E h,) entries."""
        h, d = self.num_heads, self.head_dim
        nodes = query.shape[0] // h
        z = query.reshape(nodes, h * d).index_select(0, pattern.target)  # (E, h d): q_i
        z = z + key.reshape(nodes, h * d).index_select(0, pattern.source)  # + k_j
        edge_term = self._edge_term(edge_attr, query.dtype)
        if edge_term is not None:
            z = z + edge_term
        activated = F.leaky_relu(z, self.config.negative_slope).view(-1, h, d)
        return pattern.to_entries((activated * self.att).sum(-1))  # (E h,)
