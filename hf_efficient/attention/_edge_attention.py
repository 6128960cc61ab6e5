"""The edge machinery every core that attends along a graph's edges shares (``graph_sparse``, ``gat``,
``gatv2``, ``multi_hop``): the pattern, the softmax over each target's incoming edges, the weighted sum, the
returned weights and the base class :class:`EdgeAttention`. The leading underscore keeps this module out of
the registry's auto-import; the cores live in their own files.

All heads go through one sparse kernel call: the encoder blocks hand over heads as (b, h, n, d) views of
(b, n, h, d) tensors, which are, without a copy, (b n h, d) matrices of *slots* (row ``node * h + head``),
and head hh's attention from node i to node j is entry (i h + hh, j h + hh) of one (N h x N h) sparse matrix
that never mixes heads (N = b n). Scores are a sampled dense-dense product (``torch.sparse.sampled_addmm``)
and the weighted sum a CSR x dense product, inside custom autograd Functions whose backward passes reuse the
same two kernels on the pattern and its transpose, so they save only (E h,) probabilities and the inputs.
The pattern (edges sorted by target, its slot CSR and transpose) is built once per edge_index tensor and
reused by every layer of a forward (a small cache keyed on the tensor's identity and version, so an in-place
edit rebuilds it). Cost: O(E h d) time and O(E h) memory beyond the inputs; no (n x n) matrix and no
(E, h, d) gathered tensor is ever built.

Why one call over slots rather than a loop over heads: with the loop each head was first copied out of
the (b, n, h, d) layout and its 64-byte rows were read at random (measured on 2.2M random edges, hidden
64, 4 heads, one thread: copies took a third of the core's time), while a slot row's neighbours are the
same node's other heads, so a source node's heads are read together.

While tracing (torch.export, torch.compile, ONNX; ``is_tracing()``) every core over edges computes the same
maths with :class:`EdgeScatter` instead: gathers, ``scatter_reduce`` and ``index_add`` over the edges in the
caller's order (no sort, no CSR, no data-dependent size; self loops appended for every node slot and masked),
plain autograd, O(E h d) memory. The contract tests check it equals this eager path.

Shared by every edge core:
    * the softmax subtracts the per-target maximum (exact, stable);
    * edge weights enter as log w_ij added to the scores (p_ij ∝ w_ij exp(s_ij));
    * a node with no incoming edge (isolated, or padded) outputs 0; ``add_self_loops`` gives every real node
      exactly one self loop;
    * float16/bfloat16 inputs are computed in float32 (the CPU sparse kernels need it) and cast back;
    * the backward is once-differentiable (no double backward);
    * ``output_attentions=True`` returns the per-edge probabilities as a sparse COO tensor of shape
      (b, h, n, n) (O(E h) memory; ``.to_dense()`` gives the matrix; duplicate edges are summed).
"""

from __future__ import annotations

import functools
import warnings
import weakref
from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

from .base import AttentionCapabilities, AttentionCore, AttentionOutput
from .config import AttentionConfig
from .inputs import AttentionInputs, GraphEdges, is_tracing


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


# Bytes of the dense operand per column block of a CSR x dense product (see EdgePattern._blocked_product):
# about an L2 and a half of this machine (2 MiB L2 per core, 32 MiB shared L3); 8 blocks of 6.4 MB were the
# fastest cut of a 51 MB operand.
COLUMN_BLOCK_BYTES = 8 * 2**20


def _column_block_count(dense: torch.Tensor) -> int:
    """How many column blocks a product reading rows of ``dense`` at random is cut into: ceil(bytes of
    ``dense`` / ``COLUMN_BLOCK_BYTES``) on a CPU; 1 (the plain, unblocked product) below one block and on
    other devices, whose sparse kernels and caches the block size was not measured for."""
    if dense.device.type != "cpu":
        return 1
    return -(-dense.numel() * dense.element_size() // COLUMN_BLOCK_BYTES)


def _index_dtype(largest: int) -> torch.dtype:
    """int32 indices while they fit (half the memory and bandwidth of int64), else int64."""
    return torch.int32 if largest < 2**31 - 1 else torch.int64


class EdgePattern:
    """The edges of a padded batch as CSR over (node, head) slots, built once and shared by every layer.

    Edges are sorted by target (stable). Per-entry tensors (scores, probabilities) are 1-D of length E h in
    *entry order*: rows by target slot ``i * h + head``, and within a row the target's incoming edges in
    sorted order; entry (i h + hh, j h + hh) is head hh's attention from target i to source j.

    Attributes:
        num_nodes: N = b n, flattened node positions.
        num_heads: h.
        source, target: (E,) endpoints of the pattern's edges, sorted by target.
        edge: (E,) for each pattern edge, its row in ``[given edges; added self loops]`` (see
            :meth:`edge_values`).
        loop_nodes: (L,) the nodes that received a self loop (None without ``add_self_loops``).
        crow, in_degree: (N + 1,) row pointers and (N,) in-degrees over nodes.
        slot_crow, slot_col: the (N h x N h) slot CSR's row pointers (N h + 1,) and columns (E h,).
    """

    traced: ClassVar[bool] = False  # True for EdgeScatter, the traced form
    _CACHE_SIZE = 4  # patterns kept: a model may mix cores with and without self loops, or head counts
    _cache: list = []  # [(weakref to edge_index, weakref to loop mask or None, key, pattern)], newest last

    def __init__(
        self,
        edge_index: torch.Tensor,
        num_nodes: int,
        num_heads: int = 1,
        loop_mask: torch.Tensor | None = None,
    ):
        source, target = edge_index.long()
        device = source.device
        given = source.numel()
        edge = torch.arange(given, device=device)
        self.kept, self.kept_target, self.loop_nodes = None, None, None
        if loop_mask is not None:  # remove the graph's self loops, then add one to every node of the mask
            self.kept = (source != target).nonzero().squeeze(1)  # (E_kept,)
            self.kept_target = target[self.kept]
            self.loop_nodes = loop_mask.reshape(-1).nonzero().squeeze(1)  # (L,)
            loops = torch.arange(given, given + self.loop_nodes.numel(), device=device)
            edge = torch.cat([self.kept, loops])
            source = torch.cat([source[self.kept], self.loop_nodes])
            target = torch.cat([target[self.kept], self.loop_nodes])
        if target.numel() > 1 and bool((target[1:] < target[:-1]).any()):
            order = torch.argsort(target, stable=True)  # (E,)
            edge, source, target = edge[order], source[order], target[order]
        self.num_given = given
        self.num_nodes, self.num_heads = num_nodes, num_heads
        self.edge, self.source, self.target = edge, source, target
        self.crow = _row_pointers(target, num_nodes)  # (N + 1,)
        self.in_degree = self.crow.diff()  # (N,)
        self.slot_crow, self.slot_col, self.slot_entry = self._slot_csr(
            self.crow, self.in_degree, source, target
        )
        self.slot_row_length = self.slot_crow.diff()  # (N h,)
        self.num_entries = target.numel() * num_heads

    @classmethod
    def of(
        cls,
        edge_index: torch.Tensor,
        num_nodes: int,
        num_heads: int = 1,
        loop_mask: torch.Tensor | None = None,
    ) -> EdgePattern:
        """The pattern of ``edge_index`` (with self loops on ``loop_mask``'s nodes if given), reused while
        every layer of a forward gets the same tensors."""
        key = (edge_index._version, edge_index.device, num_nodes, num_heads)
        if loop_mask is not None:
            key += (loop_mask._version, tuple(loop_mask.shape))
        alive = [
            entry for entry in cls._cache if entry[0]() is not None
        ]  # a freed edge_index frees its pattern
        for ref, mask_ref, cached_key, pattern in alive:
            mask = None if mask_ref is None else mask_ref()
            if ref() is edge_index and mask is loop_mask and (mask_ref is None) == (loop_mask is None):
                if cached_key == key:
                    return pattern
        pattern = cls(edge_index, num_nodes, num_heads, loop_mask)
        mask_ref = None if loop_mask is None else weakref.ref(loop_mask)
        cls._cache = [*alive[-(cls._CACHE_SIZE - 1) :], (weakref.ref(edge_index), mask_ref, key, pattern)]
        return pattern

    def _slot_csr(self, crow, in_degree, source, target):
        """Row pointers (N h + 1,), columns (E h,) and, per entry, its (edge, head) index e h + hh (E h,)."""
        h, num_edges = self.num_heads, target.numel()
        device = target.device
        sorted_edges = torch.arange(num_edges, device=device)
        position = _entry_positions(sorted_edges, target, crow, in_degree, h)  # (E h,) entry of (e, hh)
        index_dtype = _index_dtype(max(self.num_nodes * h, num_edges * h))
        slot_col = torch.empty(num_edges * h, dtype=index_dtype, device=device)
        slot_col[position] = _slots_of(source, h).to(index_dtype)
        slot_entry = torch.empty(num_edges * h, dtype=index_dtype, device=device)
        slot_entry[position] = torch.arange(num_edges * h, device=device, dtype=index_dtype)
        slot_crow = _row_pointers_from_lengths(in_degree.repeat_interleave(h))  # row (i, hh): i's in-edges
        return slot_crow.to(index_dtype), slot_col, slot_entry

    @functools.cached_property
    def transpose(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The pattern by source slot: (entries of the transpose in entry order (E h,), its row pointers
        (N h + 1,), its columns = target slots (E h,))."""
        h, num_edges = self.num_heads, self.target.numel()
        device = self.target.device
        by_source = torch.argsort(self.source, stable=True)  # (E,) target-sorted edge positions by source
        source, target = self.source[by_source], self.target[by_source]
        crow_t = _row_pointers(source, self.num_nodes)
        out_degree = crow_t.diff()
        position_t = _entry_positions(torch.arange(num_edges, device=device), source, crow_t, out_degree, h)
        position = _entry_positions(by_source, target, self.crow, self.in_degree, h)  # same (edge, head)
        dtype = self.slot_col.dtype
        entries = torch.empty(num_edges * h, dtype=dtype, device=device)
        entries[position_t] = position.to(dtype)
        col_t = torch.empty(num_edges * h, dtype=dtype, device=device)
        col_t[position_t] = _slots_of(target, h).to(dtype)
        crow_slots_t = _row_pointers_from_lengths(out_degree.repeat_interleave(h))
        return entries, crow_slots_t.to(dtype), col_t

    # ---- per-edge inputs --------------------------------------------------------------------------
    def edge_values(self, values: torch.Tensor, loops: str = "mean") -> torch.Tensor:
        """Per-edge values in the caller's edge order (E_given, ...) -> the pattern's edge order (E, ...).

        Added self loops take ``loops``: ``"mean"`` (the mean over the node's incoming given edges, 0 for
        none; PyG's ``fill_value="mean"``) or ``"one"``.
        """
        if self.loop_nodes is None:
            return values.index_select(0, self.edge)
        if loops == "one":
            loop_values = values.new_ones((self.loop_nodes.numel(), *values.shape[1:]))
        else:
            sums = values.new_zeros((self.num_nodes, *values.shape[1:]))
            sums.index_add_(0, self.kept_target, values.index_select(0, self.kept))
            counts = torch.bincount(self.kept_target, minlength=self.num_nodes).clamp_(min=1)
            mean = sums / counts.view(-1, *[1] * (values.dim() - 1)).to(values.dtype)  # (N, ...)
            loop_values = mean.index_select(0, self.loop_nodes)
        return torch.cat([values, loop_values]).index_select(0, self.edge)

    def to_entries(self, values: torch.Tensor) -> torch.Tensor:
        """(E, h, ...) or (E,) values in the pattern's edge order -> entry order (E h, ...); an (E,) value is
        shared by every head."""
        if values.dim() == 1:
            values = values[:, None].expand(-1, self.num_heads)
        flat = values.reshape(self.num_entries, *values.shape[2:])  # (E h, ...), row e h + hh
        return flat.index_select(0, self.slot_entry)

    def from_entries(self, values: torch.Tensor) -> torch.Tensor:
        """The inverse of :meth:`to_entries`: (E h, ...) in entry order -> (E, h, ...) in edge order."""
        out = torch.empty_like(values).index_copy_(0, self.slot_entry.long(), values)
        return out.view(-1, self.num_heads, *values.shape[1:])

    # ---- kernels ----------------------------------------------------------------------------------
    def by_target(self, values: torch.Tensor) -> torch.Tensor:
        """(N h, N h) CSR matrix M[target slot, source slot] = values (entry order)."""
        return _csr(self.slot_crow, self.slot_col, values, self.num_nodes * self.num_heads)

    def by_source(self, values: torch.Tensor) -> torch.Tensor:
        """The transpose: (N h, N h) CSR matrix M[source slot, target slot] = values (entry order)."""
        entries, crow_t, col_t = self.transpose
        return _csr(crow_t, col_t, values.index_select(0, entries), self.num_nodes * self.num_heads)

    def target_product(self, values: torch.Tensor, dense: torch.Tensor) -> torch.Tensor:
        """``by_target(values) @ dense``: (E h,) entry values, (N h, d) -> (N h, d), column-blocked when
        ``dense`` is large (see :meth:`_blocked_product`)."""
        return self._blocked_product("target", values, dense)

    def source_product(self, values: torch.Tensor, dense: torch.Tensor) -> torch.Tensor:
        """``by_source(values) @ dense``: the transpose's product, blocked as :meth:`target_product`."""
        return self._blocked_product("source", values, dense)

    def _blocked_product(self, side: str, values: torch.Tensor, dense: torch.Tensor) -> torch.Tensor:
        """The CSR x dense product, its columns cut into blocks whose rows of ``dense`` fit in cache.

        Each entry reads the ``dense`` row of its column; on a graph without locality those reads are
        random, and once ``dense`` outgrows the cache every one is a DRAM miss. Cut into column blocks of
        about ``COLUMN_BLOCK_BYTES`` of ``dense``, out = sum_b A[:, b] @ dense[b] reads each block's rows
        from cache (measured on 200k nodes x 4 heads, d = 16, one thread: 214 ms in one product, 82 ms in
        8 blocks, 135 ms in 16, where the output's extra passes start to cost). Below one block, the plain
        product."""
        rows = self.num_nodes * self.num_heads
        count = _column_block_count(dense)
        if count <= 1:
            matrix = self.by_target(values) if side == "target" else self.by_source(values)
            return matrix @ dense
        out = dense.new_zeros(rows, dense.shape[1])
        for entries, crow, col, start, stop in self._column_blocks(side, count):
            block = _csr_rect(crow, col, values.index_select(0, entries), rows, stop - start)
            out.addmm_(block, dense[start:stop])
        return out

    def _column_blocks(self, side: str, count: int) -> list:
        """[(entry indices in entry order (e_b,), row pointers (N h + 1,), local columns (e_b,), first column,
        end column)] of the pattern (``side="target"``) or its transpose cut into ``count`` column blocks;
        built once per pattern, side and count."""
        cache = self.__dict__.setdefault("_column_block_cache", {})
        if (side, count) not in cache:
            rows = self.num_nodes * self.num_heads
            if side == "target":
                crow, col = self.slot_crow, self.slot_col
                entries = torch.arange(self.num_entries, device=col.device, dtype=col.dtype)
            else:
                entries, crow, col = self.transpose  # int32 while they fit, as every index here
            row_of = torch.arange(rows, device=col.device).repeat_interleave(crow.diff().long())  # (E h,)
            width = -(-rows // count)
            blocks = []
            for start in range(0, rows, width):
                stop = min(start + width, rows)
                keep = (col >= start) & (col < stop)  # entries of this block, still in row order
                local_rows = row_of[keep]
                blocks.append(
                    (
                        entries[keep],
                        _row_pointers(local_rows, rows).to(col.dtype),
                        (col[keep] - start).to(col.dtype),
                        start,
                        stop,
                    )
                )
            cache[(side, count)] = blocks
        return cache[(side, count)]

    def segment(self, values: torch.Tensor, reduce: str) -> torch.Tensor:
        """Reduce (E h,) entry values over each target slot's entries -> (N h,)."""
        return torch.segment_reduce(values, reduce, offsets=self.slot_crow.long(), axis=0)

    def per_entry(self, slot_values: torch.Tensor) -> torch.Tensor:
        """Broadcast (N h, ...) per-target-slot values to that slot's entries -> (E h, ...)."""
        return slot_values.repeat_interleave(self.slot_row_length, dim=0, output_size=self.num_entries)

    def source_slot_values(self, slot_values: torch.Tensor) -> torch.Tensor:
        """Gather (N h,) per-slot values at each entry's source slot -> (E h,)."""
        return slot_values.index_select(0, self.slot_col)

    def sampled_dot(self, left: torch.Tensor, right: torch.Tensor) -> torch.Tensor:
        """(E h,) dot products left[target slot] . right[source slot] for (N h, d) slot matrices.

        The reads of ``right`` follow the entries' source slots, at random on a graph without locality: when
        ``right`` is large they go through the pattern's column blocks as :meth:`_blocked_product`'s do (each
        block's dot products from cache, written back to their entries' places)."""
        count = _column_block_count(right)
        if count <= 1:
            template = self.by_target(self._zeros(left.dtype))  # beta=0 still reads them: zeros
            return torch.sparse.sampled_addmm(template, left, right.T, beta=0.0).values()
        rows = self.num_nodes * self.num_heads
        out = left.new_empty(self.num_entries)  # every entry lies in exactly one block
        for entries, crow, col, start, stop in self._column_blocks("target", count):
            zeros = self._zeros(left.dtype)[: entries.shape[0]]  # a view of the cached zeros: only read
            template = _csr_rect(crow, col, zeros, rows, stop - start)
            out[entries] = torch.sparse.sampled_addmm(template, left, right[start:stop].T, beta=0.0).values()
        return out

    def dot_scores(self, query: torch.Tensor, key: torch.Tensor, scale: float) -> torch.Tensor:
        """(E h,) scale * query[target slot] . key[source slot] for (N h, d) slot matrices."""
        return _EdgeScores.apply(query, key, self, scale)

    def softmax(self, scores: torch.Tensor) -> torch.Tensor:
        """Softmax of (E h,) entry scores over each target slot's entries."""
        return _EdgeSoftmax.apply(scores, self)

    def aggregate(self, probs: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
        """sum over a target slot's entries of probs * value[source slot]: (E h,), (N h, d) -> (N h, d)."""
        return _EdgeAggregate.apply(probs, value, self)

    def _zeros(self, dtype: torch.dtype) -> torch.Tensor:
        zeros = self.__dict__.setdefault("_zero_values", {})
        if dtype not in zeros:
            zeros[dtype] = torch.zeros(self.num_entries, dtype=dtype, device=self.target.device)
        return zeros[dtype]

    def attention_matrix(self, probs: torch.Tensor, batch: int, seq: int) -> torch.Tensor:
        """(E h,) probabilities in entry order -> sparse COO (b, h, n, n) [graph, head, target, source]
        (duplicate edges summed)."""
        h = self.num_heads
        rows = torch.arange(self.num_nodes * h, device=probs.device).repeat_interleave(
            self.slot_row_length, output_size=self.num_entries
        )  # (E h,) target slot of each entry
        target, head, source = rows // h, rows % h, self.slot_col.long() // h
        indices = torch.stack([target // seq, head, target % seq, source % seq])  # (4, E h)
        shape = (batch, h, seq, seq)
        return torch.sparse_coo_tensor(indices, probs, shape, check_invariants=False).coalesce()


class EdgeScatter:
    """The operations of :class:`EdgePattern` as gathers and scatters over the edges in the caller's order:
    what traced graphs (torch.export, torch.compile, ONNX) compute, equal to the CSR kernels up to rounding.

    No sort, no CSR, no count of edges per node, no ``nonzero``: every size is E, N or N h. Entry order is
    edge-major, entry ``e h + hh`` = (edge e, head hh), so :meth:`to_entries` / :meth:`from_entries` are
    reshapes. With self loops, the graph's self loops stay in place but are masked out of the softmax, and
    one loop per node (all N) is appended after the given edges, masked out for nodes outside the loop
    mask (padding): E_given + N edges, whichever of them take part. Autograd is plain (no custom Function),
    so memory is O(E h d) (the gathered rows), against O(E h) for the CSR kernels.

    Attributes: as :class:`EdgePattern` (``num_nodes``, ``num_heads``, ``source``, ``target``,
    ``num_entries``), plus ``active`` ((E,) bool, the edges that take part; None: all of them) and
    ``target_slots`` / ``source_slots`` ((E h,) each entry's slots).
    """

    traced: ClassVar[bool] = True

    def __init__(
        self,
        edge_index: torch.Tensor,
        num_nodes: int,
        num_heads: int = 1,
        loop_mask: torch.Tensor | None = None,
    ):
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
        self.target_slots, self.source_slots = _slots_of(target, num_heads), _slots_of(source, num_heads)

    def edge_values(self, values: torch.Tensor, loops: str = "mean") -> torch.Tensor:
        """As :meth:`EdgePattern.edge_values`: (E_given, ...) -> (E, ...), the loops' values appended."""
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
        """As :meth:`EdgePattern.attention_matrix` (inactive edges hold 0)."""
        h = self.num_heads
        target, source = self.target_slots // h, self.source_slots // h
        head = self.target_slots % h
        indices = torch.stack([target // seq, head, target % seq, source % seq])  # (4, E h)
        shape = (batch, h, seq, seq)
        return torch.sparse_coo_tensor(indices, probs, shape, check_invariants=False).coalesce()


def _entry_positions(
    sorted_edge: torch.Tensor, row: torch.Tensor, crow: torch.Tensor, degree: torch.Tensor, h: int
) -> torch.Tensor:
    """Entry of each (edge, head) in a slot CSR whose edges are sorted by ``row`` node: node i's rows
    (i h, ..., i h + h - 1) each hold its degree(i) edges, so edge e (at ``sorted_edge`` in that order) of
    head hh sits at crow[i] h + hh degree(i) + (e - crow[i]). Returns (E h,), (e, hh) at e h + hh."""
    start = crow[:-1][row]  # (E,) first edge of each edge's row node
    heads = torch.arange(h, device=row.device)
    return ((start * h + sorted_edge - start)[:, None] + heads[None, :] * degree[row][:, None]).reshape(-1)


def _slots_of(nodes: torch.Tensor, h: int) -> torch.Tensor:
    """(E,) nodes -> (E h,) their slots node h + hh, (e, hh) at e h + hh."""
    return (nodes[:, None] * h + torch.arange(h, device=nodes.device)[None, :]).reshape(-1)


def _row_pointers(rows: torch.Tensor, num_rows: int) -> torch.Tensor:
    return _row_pointers_from_lengths(torch.bincount(rows, minlength=num_rows))


def _row_pointers_from_lengths(lengths: torch.Tensor) -> torch.Tensor:
    return torch.cat([lengths.new_zeros(1), lengths.cumsum(0)])


def _csr(crow: torch.Tensor, col: torch.Tensor, values: torch.Tensor, n: int) -> torch.Tensor:
    return _csr_rect(crow, col, values, n, n)


def _csr_rect(crow: torch.Tensor, col: torch.Tensor, values: torch.Tensor, rows: int, cols: int):
    with warnings.catch_warnings():  # "Sparse CSR tensor support is in beta state"
        warnings.simplefilter("ignore")
        return torch.sparse_csr_tensor(crow, col, values, (rows, cols), check_invariants=False)


def to_slots(x: torch.Tensor) -> torch.Tensor:
    """(b, h, n, d) -> (b n h, d) slot matrix, row ``(g n + i) h + hh``; free for a view of (b, n, h, d)."""
    b, h, n, d = x.shape
    return x.transpose(1, 2).reshape(b * n * h, d)


def from_slots(slots: torch.Tensor, b: int, h: int, n: int) -> torch.Tensor:
    """(b n h, d) slot matrix -> (b, h, n, d) view (of a (b, n, h, d) tensor, as the blocks want it)."""
    return slots.view(b, n, h, -1).transpose(1, 2)


class _EdgeScores(torch.autograd.Function):
    """scores[entry] = scale * query[target slot] . key[source slot]: (N h, d) slot matrices -> (E h,)."""

    @staticmethod
    def forward(ctx, query, key, pattern: EdgePattern, scale: float):
        query, key = query.contiguous(), key.contiguous()
        ctx.save_for_backward(query, key)
        ctx.pattern, ctx.scale = pattern, scale
        return pattern.sampled_dot(query, key).mul_(scale)  # (E h,)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_scores):
        query, key = ctx.saved_tensors
        pattern, grad_scores = ctx.pattern, (grad_scores * ctx.scale).contiguous()
        needs_query, needs_key = ctx.needs_input_grad[:2]
        grad_query = pattern.target_product(grad_scores, key) if needs_query else None  # sum_j g k_j
        grad_key = pattern.source_product(grad_scores, query) if needs_key else None  # sum_i g q_i
        return grad_query, grad_key, None, None


class _EdgeSoftmax(torch.autograd.Function):
    """Softmax of (E h,) scores over each target slot's entries (max-subtracted, so exact and stable)."""

    @staticmethod
    def forward(ctx, scores, pattern: EdgePattern):
        scores = scores.contiguous()
        row_max = pattern.segment(scores, "max")  # (N h,); -inf for slots without entries
        probs = (scores - pattern.per_entry(row_max)).exp_()  # (E h,)
        probs.div_(pattern.per_entry(pattern.segment(probs, "sum")))
        ctx.save_for_backward(probs)
        ctx.pattern = pattern
        return probs

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_probs):
        (probs,) = ctx.saved_tensors
        pattern = ctx.pattern
        weighted = grad_probs * probs  # (E h,)
        row_dot = pattern.per_entry(pattern.segment(weighted, "sum"))  # (E h,)
        return weighted.sub_(probs * row_dot), None  # p (g - sum_k p_k g_k)


class _EdgeAggregate(torch.autograd.Function):
    """out[target slot] = sum over its entries of probs * value[source slot]: (E h,), (N h, d) -> (N h, d)."""

    @staticmethod
    def forward(ctx, probs, value, pattern: EdgePattern):
        probs, value = probs.contiguous(), value.contiguous()
        ctx.save_for_backward(probs, value)
        ctx.pattern = pattern
        return pattern.target_product(probs, value)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out):
        probs, value = ctx.saved_tensors
        pattern, grad_out = ctx.pattern, grad_out.contiguous()
        grad_probs = pattern.sampled_dot(grad_out, value) if ctx.needs_input_grad[0] else None  # g_i . v_j
        needs_value = ctx.needs_input_grad[1]
        grad_value = pattern.source_product(probs, grad_out) if needs_value else None  # sum_i p g_i
        return grad_probs, grad_value, None


def edge_softmax(scores: torch.Tensor, pattern: EdgePattern) -> torch.Tensor:
    """Softmax of (E h,) entry scores over each target slot's entries."""
    return pattern.softmax(scores)


def edge_aggregate(probs: torch.Tensor, value: torch.Tensor, pattern: EdgePattern) -> torch.Tensor:
    """sum over a target slot's entries of probs * value[source slot]: (E h,), (N h, d) -> (N h, d)."""
    return pattern.aggregate(probs, value)


class EdgeAttention(AttentionCore):
    """What every core attending along edges shares: input checks, the pattern (with optional self loops),
    edge weights, the softmax over each target's incoming edges, dropout, the weighted sum and the returned
    weights. Subclasses give the scores (:meth:`_edge_scores`) and may change the propagation
    (:meth:`_propagate`). Not registered itself."""

    config_class = EdgeAttentionConfig
    capabilities = AttentionCapabilities(
        padding_mask=True,
        edges=True,
        requires_edges=True,
        output_attentions=True,
        permutation_equivariant=True,
        modalities=frozenset({"graph"}),
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
        self, query: torch.Tensor, key: torch.Tensor, pattern: EdgePattern, edge_attr: torch.Tensor | None
    ) -> torch.Tensor:
        """(E h,) unnormalised scores in entry order from (N h, d) query/key slot matrices and the edge
        features in the pattern's edge order (E, F) (None without ``edge_dim``)."""
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

    def _pattern(self, edges: GraphEdges, b: int, n: int, inputs: AttentionInputs, device) -> EdgePattern:
        """The batch's pattern over b n nodes and this core's heads; with ``add_self_loops``, one loop on
        every real node (padded nodes get none: they must stay unread). While tracing, the
        :class:`EdgeScatter` of the edges in their given order."""
        edge_index = edges.edge_index.to(device)
        if is_tracing():
            loop_mask = None
            if self.config.add_self_loops:
                mask = inputs.attention_mask
                loop_mask = mask if mask is not None else torch.ones(b * n, dtype=torch.bool, device=device)
            return EdgeScatter(edge_index, b * n, self.num_heads, loop_mask)
        loop_mask = None
        if self.config.add_self_loops:
            mask = inputs.attention_mask
            loop_mask = mask if mask is not None else _all_nodes(b, n, device)
        return EdgePattern.of(edge_index, b * n, self.num_heads, loop_mask)

    def _edge_probabilities(
        self, query: torch.Tensor, key: torch.Tensor, edges: GraphEdges, pattern: EdgePattern
    ) -> torch.Tensor:
        """One-hop attention over the edges: (E h,) probabilities in entry order (softmax over each target
        slot's entries), from (N h, d) slot matrices; dropout in training."""
        edge_attr = self._edge_features(edges)
        if edge_attr is not None:
            edge_attr = pattern.edge_values(edge_attr, loops="mean")  # (E, F) in pattern order
        scores = self._edge_scores(query, key, pattern, edge_attr)  # (E h,)
        if edges.edge_weight is not None:
            weight = pattern.edge_values(edges.edge_weight.to(scores.dtype), loops="one")  # (E,)
            scores = scores + pattern.to_entries(weight.log())
        probs = edge_softmax(scores, pattern)  # (E h,)
        if self.training and self.spec.dropout > 0:
            probs = F.dropout(probs, self.spec.dropout)
        return probs

    def _propagate(self, probs: torch.Tensor, value: torch.Tensor, pattern: EdgePattern) -> torch.Tensor:
        """out_i = sum over edges j -> i of A_ij v_j: (E h,) x (N h, d) slots -> (N h, d)."""
        return edge_aggregate(probs, value, pattern)

    def _attention_weights(self, probs, pattern: EdgePattern, b: int, n: int) -> torch.Tensor:
        """What ``output_attentions`` returns: the one-hop probabilities as sparse COO (b, h, n, n)."""
        return pattern.attention_matrix(probs, b, n)

    def _attend(self, query, key, value, inputs: AttentionInputs) -> AttentionOutput:
        # The padding mask needs no more work: edges never touch padded nodes (checked by the base class),
        # so padded keys are never read and padded queries have no incoming edge (output 0).
        b, h, n, _ = query.shape
        dtype = query.dtype
        compute_dtype = dtype if dtype in (torch.float32, torch.float64) else torch.float32
        query, key, value = (to_slots(t.to(compute_dtype)) for t in (query, key, value))  # (N h, d)
        pattern = self._pattern(inputs.edges, b, n, inputs, query.device)
        probs = self._edge_probabilities(query, key, inputs.edges, pattern)
        output = from_slots(self._propagate(probs, value, pattern), b, h, n).to(dtype)
        weights = None
        if inputs.output_attentions:
            weights = self._attention_weights(probs.detach(), pattern, b, n).to(dtype)
        return AttentionOutput(output, weights)


@functools.lru_cache(maxsize=8)
def _all_nodes_cached(b: int, n: int, device: str) -> torch.Tensor:
    return torch.ones(b, n, dtype=torch.bool, device=device)


def _all_nodes(b: int, n: int, device) -> torch.Tensor:
    """A (b, n) all-True mask, the same tensor for the same shape (so the pattern cache can reuse it)."""
    return _all_nodes_cached(b, n, str(device))
