"""The edge machinery every core that attends along a graph's edges shares (``graph_sparse``, ``gat``,
``gatv2``, ``multi_hop``), in its reference form: the edges, the softmax over each target's incoming edges,
the weighted sum, the returned weights and the base class :class:`EdgeAttention`. The leading underscore
keeps this module out of the registry's auto-import; the cores live in their own files and give the scores.

Per head, for target i with incoming edges j -> i (its neighbours N(i)), scores s_ij from the core, and
optional positive edge weights w_ij:

    p_ij = w_ij exp(s_ij - m_i) / sum_{k in N(i)} w_ik exp(s_ik - m_i),    m_i = max_k s_ik
    out_i = sum_{j in N(i)} p_ij v_j

The reference (:class:`EdgeScatter`, :meth:`EdgeAttention.reference`) computes it with gathers,
``scatter_reduce`` and ``index_add`` over the edges in the caller's order: no sort, no CSR, no
data-dependent size (self loops are appended for every node slot and masked), plain autograd, so it traces
and exports; O(E h d) memory (the gathered rows). The ``"csr"`` kernel
(:mod:`hf_efficient.attention.kernels.edges`: all heads in one sparse product, custom autograd Functions,
O(E h) memory) computes the same; ``implementation="auto"`` takes it outside traced graphs.

Shared by every edge core:
    * the softmax subtracts the per-target maximum (exact, stable);
    * edge weights enter as log w_ij added to the scores (p_ij ∝ w_ij exp(s_ij));
    * a node with no incoming edge (isolated, or padded) outputs 0; ``add_self_loops`` gives every real node
      exactly one self loop;
    * float16/bfloat16 inputs are computed in float32 (the CPU sparse kernels need it) and cast back;
    * ``output_attentions=True`` returns the per-edge probabilities as a sparse COO tensor of shape
      (b, h, n, n) (O(E h) memory; ``.to_dense()`` gives the matrix; duplicate edges are summed).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from .base import AttentionCapabilities, AttentionCore, AttentionOutput
from .config import AttentionConfig
from .dropout import fast_dropout
from .inputs import AttentionInputs, GraphEdges


@dataclass
class EdgeAttentionConfig(AttentionConfig):
    """Hyperparameters every core over edges has.

    Attributes:
        edge_dim: width F of ``GraphEdges.edge_attr``; None means the core takes no edge features.
        add_self_loops: drop the graph's self loops and give every real node exactly one (as PyG's GAT
            layers do); its edge features are the mean of the node's incoming edges' (PyG's
            ``fill_value="mean"``, zeros without incoming edges), its edge weight is 1.
    """

    edge_dim: int | None = None
    add_self_loops: bool = False

    def validate(self) -> None:
        if self.edge_dim is not None and self.edge_dim < 1:
            raise ValueError(f"attention_config['edge_dim'] must be None or >= 1, got {self.edge_dim}.")


def slots_of(nodes: torch.Tensor, h: int) -> torch.Tensor:
    """(E,) nodes -> (E h,) their slots node h + hh, (e, hh) at e h + hh."""
    return (nodes[:, None] * h + torch.arange(h, device=nodes.device)[None, :]).reshape(-1)


def to_slots(x: torch.Tensor) -> torch.Tensor:
    """(b, h, n, d) -> (b n h, d) slot matrix, row ``(g n + i) h + hh``; free for a view of (b, n, h, d)."""
    b, h, n, d = x.shape
    return x.transpose(1, 2).reshape(b * n * h, d)


def from_slots(slots: torch.Tensor, b: int, h: int, n: int) -> torch.Tensor:
    """(b n h, d) slot matrix -> (b, h, n, d) view (of a (b, n, h, d) tensor, as the blocks want it)."""
    return slots.view(b, n, h, -1).transpose(1, 2)


class EdgeScatter:
    """The edges of a padded batch for the reference: gathers and scatters over the edges in the caller's
    order (the CSR kernel's :class:`~hf_efficient.attention.kernels.edges.EdgePattern` offers the same
    methods). Heads are (N h, d) *slot* matrices (row ``node * h + head``, see :func:`to_slots`).

    No sort, no CSR, no count of edges per node, no ``nonzero``: every size is E, N or N h. Entry order is
    edge-major, entry ``e h + hh`` = (edge e, head hh), so :meth:`to_entries` / :meth:`from_entries` are
    reshapes. With self loops, the graph's self loops stay in place but are masked out of the softmax, and
    one loop per node (all N) is appended after the given edges, masked out for nodes outside the loop
    mask (padding): E_given + N edges, whichever of them take part. Autograd is plain, so memory is
    O(E h d) (the gathered rows).

    Attributes:
        num_nodes, num_heads: N = b n flattened node positions, h.
        source, target: (E,) endpoints of the edges, the appended self loops last.
        num_entries: E h.
        active: (E,) bool, the edges that take part; None: all of them.
        target_slots, source_slots: (E h,) each entry's slots.
    """

    def __init__(self, edge_index: torch.Tensor, num_nodes: int, num_heads: int = 1, loop_mask=None):
        source, target = edge_index.long()
        self.num_nodes, self.num_heads = num_nodes, num_heads
        self.given_target, self.given_active, self.active = target, None, None
        if loop_mask is not None:
            nodes = torch.arange(num_nodes, device=source.device)
            self.given_active = source != target  # (E_given,) the graph's self loops are dropped
            self.active = torch.cat([self.given_active, loop_mask.reshape(-1).to(torch.bool)])
            source, target = torch.cat([source, nodes]), torch.cat([target, nodes])
        self.source, self.target = source, target
        self.num_entries = target.numel() * num_heads
        self.target_slots, self.source_slots = slots_of(target, num_heads), slots_of(source, num_heads)

    def edge_values(self, values: torch.Tensor, loops: str = "mean") -> torch.Tensor:
        """Per-edge values in the caller's order (E_given, ...) -> (E, ...), the loops' values appended:
        ``loops="mean"`` the mean over the node's incoming given edges (0 for none; PyG's
        ``fill_value="mean"``), ``"one"`` ones."""
        if self.active is None:
            return values
        shape = (self.num_nodes, *values.shape[1:])
        if loops == "one":
            return torch.cat([values, values.new_ones(shape)])
        keep = self.given_active.to(values.dtype)  # (E_given,)
        broadcast = (-1, *[1] * (values.dim() - 1))
        sums = values.new_zeros(shape).index_add(0, self.given_target, values * keep.view(broadcast))
        counts = values.new_zeros(self.num_nodes).index_add(0, self.given_target, keep).clamp(min=1)
        return torch.cat([values, sums / counts.view(broadcast)])

    def to_entries(self, values: torch.Tensor) -> torch.Tensor:
        """(E, h, ...) or (E,) values -> (E h, ...) entries; an (E,) value is shared by every head."""
        if values.dim() == 1:
            values = values[:, None].expand(-1, self.num_heads)
        return values.reshape(self.num_entries, *values.shape[2:])

    def from_entries(self, values: torch.Tensor) -> torch.Tensor:
        """(E h, ...) entries -> (E, h, ...)."""
        return values.view(-1, self.num_heads, *values.shape[1:])

    def per_entry(self, slot_values: torch.Tensor) -> torch.Tensor:
        """(N h, ...) per-slot values at each entry's target slot -> (E h, ...)."""
        return slot_values.index_select(0, self.target_slots)

    def source_slot_values(self, slot_values: torch.Tensor) -> torch.Tensor:
        """(N h, ...) per-slot values at each entry's source slot -> (E h, ...)."""
        return slot_values.index_select(0, self.source_slots)

    def dot_scores(self, query: torch.Tensor, key: torch.Tensor, scale: float) -> torch.Tensor:
        """(E h,) scale * query[target slot] . key[source slot] for (N h, d) slot matrices."""
        return (self.per_entry(query) * self.source_slot_values(key)).sum(-1) * scale

    def softmax(self, scores: torch.Tensor) -> torch.Tensor:
        """Softmax of (E h,) scores over each target slot's active entries (inactive entries get 0)."""
        if self.active is not None:
            scores = scores.masked_fill(~self.to_entries(self.active), float("-inf"))
        slots = self.num_nodes * self.num_heads
        lowest = scores.new_full((slots,), float("-inf"))
        # The maximum only keeps exp finite (the softmax does not depend on it): no gradient through it.
        row_max = lowest.scatter_reduce(0, self.target_slots, scores.detach(), "amax")
        row_max = row_max.clamp(min=torch.finfo(scores.dtype).min)  # a slot with no active entry: finite
        probs = (scores - self.per_entry(row_max)).exp()  # (E h,)
        totals = scores.new_zeros(slots).index_add(0, self.target_slots, probs)  # >= 1 where any entry
        return probs / self.per_entry(torch.where(totals > 0, totals, 1.0))

    def aggregate(self, probs: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
        """sum over a target slot's entries of probs * value[source slot]: (E h,), (N h, d) -> (N h, d)."""
        messages = probs[:, None] * self.source_slot_values(value)  # (E h, d)
        return value.new_zeros(value.shape).index_add(0, self.target_slots, messages)

    def attention_matrix(self, probs: torch.Tensor, batch: int, seq: int) -> torch.Tensor:
        """(E h,) probabilities -> sparse COO (b, h, n, n) [graph, head, target, source] (duplicate edges
        summed, inactive edges hold 0)."""
        h = self.num_heads
        target, source = self.target_slots // h, self.source_slots // h
        head = self.target_slots % h
        indices = torch.stack([target // seq, head, target % seq, source % seq])  # (4, E h)
        shape = (batch, h, seq, seq)
        return torch.sparse_coo_tensor(indices, probs, shape, check_invariants=False).coalesce()


class EdgeAttention(AttentionCore):
    """What every core attending along edges shares: input checks, the pattern (with optional self loops),
    edge weights, the softmax over each target's incoming edges, dropout, the weighted sum and the returned
    weights. Subclasses give the scores (:meth:`_edge_scores`) and may change the propagation
    (:meth:`_propagate`). Not registered itself; each core lists the ``"csr"`` kernel
    (:data:`~hf_efficient.attention.kernels.edges.CSR_KERNEL`)."""

    config_class = EdgeAttentionConfig
    cross_attention_refusal = "it attends along the edges of one graph, between nodes of the same sequence"
    capabilities = AttentionCapabilities(
        padding_mask=True,
        edges=True,
        requires_edges=True,
        output_attentions=True,
        permutation_equivariant=True,
        modalities=frozenset({"graph"}),
        packed_sequences=True,  # edges never join two graphs: a packed stream needs no cutting
    )

    # Rows of width h d read along the edges by one forward + backward (see edge_traffic_bytes): scores read
    # k_j, the sum v_j; backward: grad q reads k_j, grad k reads q_i, grad p reads v_j, grad v reads g_i.
    edge_rows_read: ClassVar[int] = 6

    @classmethod
    def edge_traffic_bytes(
        cls, num_edges: int, hidden: int, num_heads: int, config, element_bytes: int = 4
    ) -> float:
        """Bytes one forward + backward must move along the edges at least: ``edge_rows_read`` gathered rows
        of h d values per edge, plus the per-edge, per-head scores and probabilities (written, then read:
        8 E h). The kernels are memory-bound, so this over their time is their achieved bandwidth."""
        return float(num_edges) * element_bytes * (cls.edge_rows_read * hidden + 8 * num_heads)

    def _edge_scores(
        self, query: torch.Tensor, key: torch.Tensor, pattern, edge_attr: torch.Tensor | None
    ) -> torch.Tensor:
        """(E h,) unnormalised scores in entry order from (N h, d) query/key slot matrices and the edge
        features in the pattern's edge order (E, F) (None without ``edge_dim``). ``pattern`` is the
        reference's :class:`EdgeScatter` or the kernel's ``EdgePattern`` (the same methods)."""
        raise NotImplementedError

    def _edge_features(self, edges: GraphEdges) -> torch.Tensor | None:
        """Check edge_attr against edge_dim (nothing is silently ignored); return it or None."""
        attr, edge_dim, name = edges.edge_attr, self.config.edge_dim, self.attention_type
        if attr is None and edge_dim is not None:
            raise ValueError(
                f"{name} was built with attention_config['edge_dim']={edge_dim} but the edges carry no "
                "edge_attr; pass GraphEdges(edge_attr=...) of shape (E, edge_dim) or set edge_dim=None."
            )
        if attr is not None and edge_dim is None:
            raise ValueError(
                f"{name} got edge_attr of width {attr.shape[-1]} but attention_config['edge_dim'] is "
                "None, so the features would be ignored; set edge_dim to that width or drop edge_attr."
            )
        if attr is not None and attr.shape[-1] != edge_dim:
            raise ValueError(
                f"{name}: edge_attr has width {attr.shape[-1]} but attention_config['edge_dim'] is "
                f"{edge_dim}; they must match."
            )
        return attr

    def reference(self, query, key, value, inputs: AttentionInputs) -> AttentionOutput:
        """The edges in the caller's order (:class:`EdgeScatter`; with ``add_self_loops`` one loop appended
        per node slot, those of padded nodes masked out), then :meth:`attend_edges`."""
        b, _, n, _ = query.shape
        loop_mask = None
        if self.config.add_self_loops:
            mask = inputs.attention_mask
            loop_mask = mask if mask is not None else torch.ones(b * n, dtype=torch.bool, device=query.device)
        edge_index = inputs.edges.edge_index.to(query.device)
        pattern = EdgeScatter(edge_index, b * n, self.num_heads, loop_mask)
        return self.attend_edges(query, key, value, inputs, pattern)

    def attend_edges(
        self, query, key, value, inputs: AttentionInputs, pattern, scores=None
    ) -> AttentionOutput:
        """Edge attention over ``pattern`` (the reference's or the kernel's): scores (``scores(core, query,
        key, pattern, edge_attr)``, default :meth:`_edge_scores`), softmax over each target's entries,
        :meth:`_propagate`, and the weights if asked for.

        The padding mask needs no more work: edges never touch padded nodes (checked by the base class), so
        padded keys are never read and padded queries have no incoming edge (output 0)."""
        b, h, n, _ = query.shape
        dtype = query.dtype
        compute_dtype = dtype if dtype in (torch.float32, torch.float64) else torch.float32
        query, key, value = (to_slots(t.to(compute_dtype)) for t in (query, key, value))  # (N h, d)
        probs = self._edge_probabilities(query, key, inputs.edges, pattern, scores or type(self)._edge_scores)
        output = from_slots(self._propagate(probs, value, pattern), b, h, n).to(dtype)
        weights = None
        if inputs.output_attentions:
            weights = self._attention_weights(probs.detach(), pattern, b, n).to(dtype)
        return AttentionOutput(output, weights)

    def _edge_probabilities(self, query, key, edges: GraphEdges, pattern, scores) -> torch.Tensor:
        """One-hop attention over the edges: (E h,) probabilities in entry order (softmax over each target
        slot's entries), from (N h, d) slot matrices; dropout in training."""
        edge_attr = self._edge_features(edges)
        if edge_attr is not None:
            edge_attr = pattern.edge_values(edge_attr, loops="mean")  # (E, F) in pattern order
        scores = scores(self, query, key, pattern, edge_attr)  # (E h,)
        if edges.edge_weight is not None:
            weight = pattern.edge_values(edges.edge_weight.to(scores.dtype), loops="one")  # (E,)
            scores = scores + pattern.to_entries(weight.log())
        probs = pattern.softmax(scores)  # (E h,)
        probs = fast_dropout(probs, self.spec.dropout, self.training)
        return probs

    def _propagate(self, probs: torch.Tensor, value: torch.Tensor, pattern) -> torch.Tensor:
        """out_i = sum over edges j -> i of A_ij v_j: (E h,) x (N h, d) slots -> (N h, d)."""
        return pattern.aggregate(probs, value)

    def _attention_weights(self, probs, pattern, b: int, n: int) -> torch.Tensor:
        """What ``output_attentions`` returns: the one-hop probabilities as sparse COO (b, h, n, n)."""
        return pattern.attention_matrix(probs, b, n)
