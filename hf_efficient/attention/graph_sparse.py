"""Graph-sparse attention: softmax over a graph's edges only (Dwivedi & Bresson 2021, GAT-style neighbours).

Each node (a query) attends only to the sources of its incoming edges. For target i with in-neighbours N(i):

    s_ij = q_i . k_j / sqrt(d)                           (per head)
    s_ij <- s_ij * (W_E e_ij)_h    ("multiply", default: softmax(QK^T/sqrt(d) (.) A_G (.) W_E E) V)
         or s_ij + (W_E e_ij)_h    ("add", an edge bias)          only when edge_dim is set
    p_ij = w_ij exp(s_ij) / sum_{k in N(i)} w_ik exp(s_ik)        (w = optional positive edge weights)
    out_i = sum_{j in N(i)} p_ij v_j

Cost: O(E h d) time and O(E h) memory beyond the inputs (a few (E, h) score/probability tensors and one
(b * n, d) copy per head); no (n x n) matrix and no (E, h, d) gathered tensor is ever built. Scores are a
sampled dense-dense product (``torch.sparse.sampled_addmm``) and the weighted sum a CSR x dense product,
one head at a time, inside custom autograd Functions whose backward passes reuse the same two kernels on
the edge pattern and its transpose, so they save only (E, h) probabilities and the inputs. As nothing of
size (E, h, d) exists, no edge chunking is needed. The CSR pattern (edges sorted by target) is built once per
edge_index tensor and reused by every layer of a forward (a one-slot cache keyed on the tensor's identity
and version, so an in-place edit rebuilds it).

Deviations from the paper:
    * the edge projection W_E (``Linear(edge_dim, heads)``) gives one scalar per head and edge (the lecture's
      form); the paper projects edges to d values per head, multiplies them into q (.) k before the sum,
      and also updates an edge stream, which this core does not produce;
    * the softmax subtracts the per-target maximum (exact, stable) instead of the paper's clamp to [-5, 5];
    * edge weights enter as log w_ij added to the scores (p_ij ∝ w_ij exp(s_ij)), not in the paper;
    * a node with no incoming edge (isolated, or padded) outputs 0; add self-loops if it should see itself;
    * float16/bfloat16 inputs are computed in float32 (the CPU sparse kernels need it) and cast back;
    * the backward is once-differentiable (no double backward).
"""

from __future__ import annotations

import functools
import warnings
import weakref
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.autograd.function import once_differentiable

from .base import AttentionCapabilities, AttentionCore, AttentionOutput
from .config import AttentionConfig
from .inputs import AttentionInputs, GraphEdges, is_tracing
from .registry import register_attention

EDGE_FEATURE_MODES = ("multiply", "add")


@dataclass
class GraphSparseConfig(AttentionConfig):
    """Hyperparameters of :class:`GraphSparseAttention`.

    Attributes:
        edge_dim: width F of ``GraphEdges.edge_attr``; None means the core takes no edge features.
        edge_feature_mode: ``"multiply"`` scales each score by (W_E e)_h, ``"add"`` adds it.
    """

    edge_dim: int | None = None
    edge_feature_mode: str = "multiply"

    def validate(self) -> None:
        if self.edge_dim is not None and self.edge_dim < 1:
            raise ValueError(f"attention_config['edge_dim'] must be None or >= 1, got {self.edge_dim}.")
        if self.edge_feature_mode not in EDGE_FEATURE_MODES:
            raise ValueError(
                f"attention_config['edge_feature_mode'] must be one of {EDGE_FEATURE_MODES}, "
                f"got {self.edge_feature_mode!r}."
            )


class EdgePattern:
    """The sparsity pattern of a graph as CSR over targets (rows) and, built on first use, over sources.

    Edges are kept sorted by target; ``order`` maps that edge order back to the caller's edge order.
    """

    _last: tuple = (None, None, None)  # (weakref to edge_index, its version and size, pattern)

    def __init__(self, edge_index: torch.Tensor, num_nodes: int):
        source, target = edge_index.long()
        self.order = None
        if target.numel() > 1 and bool((target[1:] < target[:-1]).any()):
            self.order = torch.argsort(target, stable=True)  # (E,)
            source, target = source[self.order], target[self.order]
        self.num_nodes, self.source, self.target = num_nodes, source, target
        self.crow = self._row_pointers(target)  # (N + 1,)
        self.in_degree = self.crow.diff()  # (N,)

    @classmethod
    def of(cls, edge_index: torch.Tensor, num_nodes: int) -> EdgePattern:
        """The pattern of ``edge_index``, reused while every layer of a forward gets the same tensor."""
        ref, key, pattern = cls._last
        new_key = (edge_index._version, edge_index.device, num_nodes)
        if ref is None or ref() is not edge_index or key != new_key:
            pattern = cls(edge_index, num_nodes)
            cls._last = (weakref.ref(edge_index), new_key, pattern)
        return pattern

    def _row_pointers(self, rows: torch.Tensor) -> torch.Tensor:
        counts = torch.bincount(rows, minlength=self.num_nodes)
        return torch.cat([counts.new_zeros(1), counts.cumsum(0)])

    @functools.cached_property
    def transpose(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(edge positions sorted by source (E,), row pointers over sources (N + 1,), their targets (E,))."""
        order_t = torch.argsort(self.source, stable=True)
        return order_t, self._row_pointers(self.source), self.target[order_t]

    def by_target(self, values: torch.Tensor) -> torch.Tensor:
        """(N, N) CSR matrix M[target, source] = values[e]."""
        return _csr(self.crow, self.source, values, self.num_nodes)

    def by_source(self, values: torch.Tensor) -> torch.Tensor:
        """The transpose: (N, N) CSR matrix M[source, target] = values[e]."""
        order_t, crow_t, col_t = self.transpose
        return _csr(crow_t, col_t, values[order_t], self.num_nodes)

    def segment(self, values: torch.Tensor, reduce: str) -> torch.Tensor:
        """Reduce (E, h) edge values over each target's incoming edges -> (N, h) (edges are target-sorted)."""
        return torch.segment_reduce(values, reduce, offsets=self.crow, axis=0)

    def per_edge(self, node_values: torch.Tensor) -> torch.Tensor:
        """Broadcast (N, h) per-target values to that target's incoming edges -> (E, h)."""
        return node_values.repeat_interleave(self.in_degree, dim=0, output_size=self.target.numel())

    def sampled_dot(self, left: torch.Tensor, right: torch.Tensor) -> torch.Tensor:
        """(E,) dot products left[target_e] . right[source_e] for (N, d) matrices, without gathering rows."""
        template = self.by_target(left.new_zeros(self.target.numel()))  # beta=0 still reads the values
        return torch.sparse.sampled_addmm(template, left, right.T, beta=0.0).values()

    def scores(self, query: torch.Tensor, key: torch.Tensor, scale: float) -> torch.Tensor:
        """(E, h) scaled dot products q_target . k_source, edges in the pattern's (target) order."""
        return _EdgeScores.apply(query, key, self, scale)

    def softmax(self, scores: torch.Tensor) -> torch.Tensor:
        """Softmax of (E, h) scores over each target's incoming edges."""
        return _EdgeSoftmax.apply(scores, self)

    def aggregate(self, probs: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
        """(b, h, n, d): each target's sum of probs[e] * value[source_e] over its incoming edges."""
        return _EdgeAggregate.apply(probs, value, self)


class EdgeScatter:
    """The operations of :class:`EdgePattern` as gathers and scatters over the edges in their given order:
    what traced graphs (torch.export, torch.compile, ONNX) compute. No sort, no CSR, no count of edges per
    node: every size is E or N. Memory O(E h d) (the gathered rows), against O(E h) for the CSR kernels.
    """

    order = None  # the edges stay in the caller's order

    def __init__(self, edge_index: torch.Tensor, num_nodes: int):
        self.source, self.target = edge_index.long()
        self.num_nodes = num_nodes

    @staticmethod
    def _node_rows(x: torch.Tensor) -> torch.Tensor:
        """(b, h, n, d) -> (b * n, h, d): one row per node of the flattened batch."""
        return x.transpose(1, 2).flatten(0, 1)

    def scores(self, query: torch.Tensor, key: torch.Tensor, scale: float) -> torch.Tensor:
        q, k = self._node_rows(query), self._node_rows(key)  # (N, h, d)
        return (q.index_select(0, self.target) * k.index_select(0, self.source)).sum(-1) * scale  # (E, h)

    def softmax(self, scores: torch.Tensor) -> torch.Tensor:
        index = self.target[:, None].expand_as(scores)  # (E, h)
        lowest = scores.new_full((self.num_nodes, scores.shape[1]), float("-inf"))
        row_max = lowest.scatter_reduce(0, index, scores, "amax")  # (N, h)
        probs = (scores - row_max.index_select(0, self.target)).exp()  # (E, h)
        totals = scores.new_zeros(self.num_nodes, scores.shape[1]).index_add(0, self.target, probs)
        return probs / totals.index_select(0, self.target)

    def aggregate(self, probs: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
        b, h, n, d = value.shape
        messages = probs[..., None] * self._node_rows(value).index_select(0, self.source)  # (E, h, d)
        out = value.new_zeros(b * n, h, d).index_add(0, self.target, messages)
        return out.view(b, n, h, d).transpose(1, 2)  # (b, h, n, d)


def _csr(crow: torch.Tensor, col: torch.Tensor, values: torch.Tensor, n: int) -> torch.Tensor:
    with warnings.catch_warnings():  # "Sparse CSR tensor support is in beta state"
        warnings.simplefilter("ignore")
        return torch.sparse_csr_tensor(crow, col, values, (n, n), check_invariants=False)


def _head_nodes(x: torch.Tensor, head: int) -> torch.Tensor:
    """(b, h, n, d) -> one head's node matrix (b * n, d), contiguous."""
    b, _, n, d = x.shape
    return x[:, head].reshape(b * n, d).contiguous()  # (b * n, d)


def _put_head(out: torch.Tensor, head: int, nodes: torch.Tensor) -> None:
    """Write a (b * n, d) node matrix into head ``head`` of a (b, h, n, d) tensor."""
    b, _, n, d = out.shape
    out[:, head] = nodes.view(b, n, d)  # (b * n, d) -> (b, n, d)


class _EdgeScores(torch.autograd.Function):
    """scores[e, h] = scale * query[:, h, target_e] . key[:, h, source_e]: (E, h)."""

    @staticmethod
    def forward(ctx, query, key, pattern: EdgePattern, scale: float):
        ctx.save_for_backward(query, key)
        ctx.pattern, ctx.scale = pattern, scale
        heads = range(query.shape[1])
        scores = [pattern.sampled_dot(_head_nodes(query, h), _head_nodes(key, h)) for h in heads]
        return torch.stack(scores, dim=1).mul_(scale)  # (E, h)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_scores):
        query, key = ctx.saved_tensors
        pattern, grad_scores = ctx.pattern, grad_scores * ctx.scale
        grad_query = torch.empty_like(query) if ctx.needs_input_grad[0] else None
        grad_key = torch.empty_like(key) if ctx.needs_input_grad[1] else None
        for h in range(query.shape[1]):
            grad_h = grad_scores[:, h].contiguous()  # (E,)
            if grad_query is not None:  # dq_i = sum_j g_ij k_j
                _put_head(grad_query, h, pattern.by_target(grad_h) @ _head_nodes(key, h))
            if grad_key is not None:  # dk_j = sum_i g_ij q_i
                _put_head(grad_key, h, pattern.by_source(grad_h) @ _head_nodes(query, h))
        return grad_query, grad_key, None, None


class _EdgeSoftmax(torch.autograd.Function):
    """Softmax of (E, h) scores over each target's incoming edges (max-subtracted, so exact and stable)."""

    @staticmethod
    def forward(ctx, scores, pattern: EdgePattern):
        scores = scores.contiguous()
        row_max = pattern.segment(scores, "max")  # (N, h); -inf for nodes without incoming edges
        probs = (scores - pattern.per_edge(row_max)).exp_()  # (E, h)
        probs.div_(pattern.per_edge(pattern.segment(probs, "sum")))
        ctx.save_for_backward(probs)
        ctx.pattern = pattern
        return probs

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_probs):
        (probs,) = ctx.saved_tensors
        pattern = ctx.pattern
        weighted = grad_probs * probs  # (E, h)
        row_dot = pattern.per_edge(pattern.segment(weighted, "sum"))  # (E, h)
        return weighted.sub_(probs * row_dot), None  # p (g - sum_k p_k g_k)


class _EdgeAggregate(torch.autograd.Function):
    """out[:, h, i] = sum over edges e into i of probs[e, h] * value[:, h, source_e]: (b, h, n, d)."""

    @staticmethod
    def forward(ctx, probs, value, pattern: EdgePattern):
        ctx.save_for_backward(probs, value)
        ctx.pattern = pattern
        out = torch.empty_like(value, memory_format=torch.contiguous_format)
        for h in range(value.shape[1]):
            _put_head(out, h, pattern.by_target(probs[:, h].contiguous()) @ _head_nodes(value, h))
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out):
        probs, value = ctx.saved_tensors
        pattern = ctx.pattern
        grad_probs = torch.empty_like(probs) if ctx.needs_input_grad[0] else None
        grad_value = torch.empty_like(value) if ctx.needs_input_grad[1] else None
        for h in range(value.shape[1]):
            grad_h = _head_nodes(grad_out, h)  # (b * n, d)
            if grad_probs is not None:  # dp_e = g_target . v_source
                grad_probs[:, h] = pattern.sampled_dot(grad_h, _head_nodes(value, h))
            if grad_value is not None:  # dv_j = sum_i p_ij g_i
                _put_head(grad_value, h, pattern.by_source(probs[:, h].contiguous()) @ grad_h)
        return grad_probs, grad_value, None


@register_attention("graph_sparse")
class GraphSparseAttention(AttentionCore):
    """Attention restricted to graph edges, O(E) memory; see the module docstring for the maths."""

    config_class = GraphSparseConfig
    capabilities = AttentionCapabilities(
        padding_mask=True,
        edges=True,
        requires_edges=True,
        permutation_equivariant=True,
        modalities=frozenset({"graph"}),
    )
    paper = "Dwivedi & Bresson 2021, A Generalization of Transformer Networks to Graphs"
    cost = "O(E)"
    summary = "softmax over a graph's edges, edge weights and edge features"
    export_note = "edges by gathers and scatters, O(E h d); edge values are trusted (not checked)"

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

    def _edge_features(self, edges: GraphEdges) -> torch.Tensor | None:
        """Check edge_attr against edge_dim (nothing is silently ignored); return it or None."""
        attr, edge_dim = edges.edge_attr, self.config.edge_dim
        if attr is None and edge_dim is not None:
            raise ValueError(
                f"graph_sparse was built with attention_config['edge_dim']={edge_dim} but the edges carry no "
                "edge_attr; pass GraphEdges(edge_attr=...) of shape (E, edge_dim) or set edge_dim=None."
            )
        if attr is not None and edge_dim is None:
            raise ValueError(
                f"graph_sparse got edge_attr of width {attr.shape[-1]} but attention_config['edge_dim'] is "
                "None, so the features would be ignored; set edge_dim to that width or drop edge_attr."
            )
        if attr is not None and attr.shape[-1] != edge_dim:
            raise ValueError(
                f"graph_sparse: edge_attr has width {attr.shape[-1]} but attention_config['edge_dim'] is "
                f"{edge_dim}; they must match."
            )
        return attr

    def _edge_probabilities(self, query, key, edges: GraphEdges) -> tuple[torch.Tensor, EdgePattern]:
        """One-hop attention A over the edges: (E, h) probabilities (softmax over each target's incoming
        edges, in the pattern's edge order) and the pattern (:class:`EdgeScatter` while tracing). Shared
        with multi_hop."""
        edge_attr = self._edge_features(edges)
        b, _, n, _ = query.shape
        edge_index = edges.edge_index.to(query.device)
        pattern = EdgeScatter(edge_index, b * n) if is_tracing() else EdgePattern.of(edge_index, b * n)

        def in_target_order(t: torch.Tensor) -> torch.Tensor:
            return t if pattern.order is None else t[pattern.order]

        scores = pattern.scores(query, key, self.scaling)  # (E, h)
        if edge_attr is not None:
            weight = self.edge_projection.weight
            projected = self.edge_projection(in_target_order(edge_attr).to(weight.dtype)).to(query.dtype)
            mode = self.config.edge_feature_mode
            scores = scores * projected if mode == "multiply" else scores + projected
        if edges.edge_weight is not None:
            scores = scores + in_target_order(edges.edge_weight).to(query.dtype).log()[:, None]  # (E, 1)
        probs = pattern.softmax(scores)  # (E, h)
        if self.training and self.spec.dropout > 0:
            probs = F.dropout(probs, self.spec.dropout)
        return probs, pattern

    def _propagate(self, probs: torch.Tensor, value: torch.Tensor, pattern: EdgePattern) -> torch.Tensor:
        """out_i = sum over edges j -> i of A_ij v_j: (E, h) x (b, h, n, d) -> (b, h, n, d)."""
        return pattern.aggregate(probs, value)

    def _attend(self, query, key, value, inputs: AttentionInputs) -> AttentionOutput:
        edges = inputs.edges
        # The padding mask needs no work here: edges never touch padded nodes (checked by the base class),
        # so padded keys are never read and padded queries have no incoming edge (output 0).
        dtype = query.dtype
        compute_dtype = dtype if dtype in (torch.float32, torch.float64) else torch.float32
        query, key, value = (t.to(compute_dtype) for t in (query, key, value))
        probs, pattern = self._edge_probabilities(query, key, edges)
        return AttentionOutput(self._propagate(probs, value, pattern).to(dtype), None)
