"""The CSR kernel of the edge machinery (:mod:`hf_efficient.attention._edge_attention`), the ``"csr"``
kernel of every core over edges (``graph_sparse``, ``gat``, ``gatv2``, ``multi_hop``).

It computes the reference's maths (scores per edge, softmax over each target's incoming edges, weighted sum)
with all heads in one sparse kernel call: the encoder blocks hand over heads as (b, h, n, d) views of
(b, n, h, d) tensors, which are, without a copy, (b n h, d) matrices of *slots* (row ``node * h + head``),
and head hh's attention from node i to node j is entry (i h + hh, j h + hh) of one (N h x N h) sparse matrix
that never mixes heads (N = b n). Scores are a sampled dense-dense product (``torch.sparse.sampled_addmm``)
and the weighted sum a CSR x dense product, inside custom autograd Functions whose backward passes reuse the
same two kernels on the pattern and its transpose, so they save only (E h,) probabilities and the inputs.
GATv2's per-edge vectors go through :class:`GATv2Scores`, chunked over edges and recomputed in backward.
The pattern (edges sorted by target, its slot CSR and transpose) is built once per edge_index tensor and
reused by every layer of a forward (a small cache keyed on the tensor's identity and version, so an in-place
edit rebuilds it). Cost: O(E h d) time and O(E h) memory beyond the inputs; no (n x n) matrix and no
(E, h, d) gathered tensor is ever built.

Why one call over slots rather than a loop over heads: with the loop each head is first copied out of the
(b, n, h, d) layout and its rows are read at random, while a slot row's neighbours are the same node's other
heads, so a source node's heads are read together.

Not traced (``traces=False``): while tracing, ``"auto"`` takes the reference. Float16/bfloat16 inputs are
computed in float32 (the CPU sparse kernels need it) by the shared :meth:`EdgeAttention.attend_edges`; the
backward is once-differentiable (no double backward).
"""

from __future__ import annotations

import functools
import warnings
import weakref

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

from ...compat import tensor_version
from .._edge_attention import slots_of
from ..base import AttentionOutput, Kernel
from ..inputs import AttentionInputs
from ..utils import CHUNK_BYTES, ChunkBuffers, rows_per_chunk

# Bytes of the dense operand per column block of a CSR x dense product (see EdgePattern._blocked_product):
# sized so that a block's rows are read from the CPU's caches (the measurement that chose it:
# benchmarks/docs/performance.md).
COLUMN_BLOCK_BYTES = 8 * 2**20
# Bytes of one (C, h d) intermediate of GATv2Scores' chunks over edges (tests shrink it to get many chunks).
GATV2_CHUNK_BYTES = CHUNK_BYTES


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

    _CACHE_SIZE = 4  # patterns kept: a model may mix cores with and without self loops, or head counts
    _cache: list = []  # [(weakref to edge_index, weakref to loop mask or None, key, pattern)], newest last

    def __init__(self, edge_index: torch.Tensor, num_nodes: int, num_heads: int = 1, loop_mask=None):
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
    def of(cls, edge_index: torch.Tensor, num_nodes: int, num_heads: int = 1, loop_mask=None) -> EdgePattern:
        """The pattern of ``edge_index`` (with self loops on ``loop_mask``'s nodes if given), reused while
        every layer of a forward gets the same tensors."""
        key = (tensor_version(edge_index), edge_index.device, num_nodes, num_heads)
        if loop_mask is not None:
            key += (tensor_version(loop_mask), tuple(loop_mask.shape))
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
        slot_col[position] = slots_of(source, h).to(index_dtype)
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
        col_t[position_t] = slots_of(target, h).to(dtype)
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
        from cache; more, smaller blocks cost extra passes over the output. Below one block, the plain
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


def _entry_positions(
    sorted_edge: torch.Tensor, row: torch.Tensor, crow: torch.Tensor, degree: torch.Tensor, h: int
) -> torch.Tensor:
    """Entry of each (edge, head) in a slot CSR whose edges are sorted by ``row`` node: node i's rows
    (i h, ..., i h + h - 1) each hold its degree(i) edges, so edge e (at ``sorted_edge`` in that order) of
    head hh sits at crow[i] h + hh degree(i) + (e - crow[i]). Returns (E h,), (e, hh) at e h + hh."""
    start = crow[:-1][row]  # (E,) first edge of each edge's row node
    heads = torch.arange(h, device=row.device)
    return ((start * h + sorted_edge - start)[:, None] + heads[None, :] * degree[row][:, None]).reshape(-1)


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


class GATv2Scores(torch.autograd.Function):
    """scores[e, hh] = att[hh] . LeakyReLU(query[t_e, hh] + key[s_e, hh] + edge_term[e, hh]), (E, h) in the
    pattern's edge order, from node-major (N, h d) query/key; chunked over edges, recomputed in backward."""

    @staticmethod
    def forward(ctx, query, key, edge_term, att, pattern: EdgePattern, negative_slope: float):
        query, key, att = query.contiguous(), key.contiguous(), att.contiguous()
        ctx.save_for_backward(query, key, edge_term, att)
        ctx.pattern, ctx.negative_slope = pattern, negative_slope
        h, d = att.shape
        num_edges = pattern.target.numel()
        scores = query.new_empty(num_edges, h)
        buffers = ChunkBuffers(query)
        for start, stop, z in _edge_sums(query, key, edge_term, pattern, buffers):
            activated = F.leaky_relu_(z, negative_slope).view(-1, h, d)  # (C, h, d), in the buffer
            torch.sum(activated.mul_(att), dim=-1, out=scores[start:stop])  # a . LeakyReLU(z)
        return scores

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_scores):
        query, key, edge_term, att = ctx.saved_tensors
        pattern, slope = ctx.pattern, ctx.negative_slope
        h, d = att.shape
        grad_query, grad_key = torch.zeros_like(query), torch.zeros_like(key)
        grad_edge = None if edge_term is None else torch.empty_like(edge_term)
        grad_att = torch.zeros_like(att)
        buffers = ChunkBuffers(query)
        for start, stop, z in _edge_sums(query, key, edge_term, pattern, buffers):
            g = grad_scores[start:stop, :, None]  # (C, h, 1)
            slopes = torch.where(z > 0, 1.0, slope).view(-1, h, d)  # LeakyReLU'(z), (C, h, d)
            activated = F.leaky_relu_(z, slope).view(-1, h, d)
            grad_att += activated.mul_(g).sum(0)  # sum_e g_e LeakyReLU(z_e)
            grad_z = slopes.mul_(att).mul_(g).view(-1, h * d)  # (C, h d): g a LeakyReLU'(z)
            grad_query.index_add_(0, pattern.target[start:stop], grad_z)  # targets sorted: sequential
            grad_key.index_add_(0, pattern.source[start:stop], grad_z)
            if grad_edge is not None:
                grad_edge[start:stop] = grad_z
        return grad_query, grad_key, grad_edge, grad_att, None, None


def _edge_sums(query, key, edge_term, pattern: EdgePattern, buffers: ChunkBuffers):
    """Yield (start, stop, z) over chunks of the pattern's edges, z = query[t] + key[s] (+ edge_term):
    (C, h d) in a reused buffer (chunks of at most GATV2_CHUNK_BYTES per intermediate)."""
    width = query.shape[1]
    num_edges = pattern.target.numel()
    chunk = rows_per_chunk(width * query.element_size(), num_edges, GATV2_CHUNK_BYTES)
    for start in range(0, num_edges, chunk):
        stop = min(num_edges, start + chunk)
        rows = (stop - start, width)
        z = torch.index_select(query, 0, pattern.target[start:stop], out=buffers("z", rows))
        z += torch.index_select(key, 0, pattern.source[start:stop], out=buffers("key", rows))
        if edge_term is not None:
            z += edge_term[start:stop]
        yield start, stop, z


@functools.lru_cache(maxsize=8)
def _all_nodes_cached(b: int, n: int, device: str) -> torch.Tensor:
    return torch.ones(b, n, dtype=torch.bool, device=device)


def _all_nodes(b: int, n: int, device) -> torch.Tensor:
    """A (b, n) all-True mask, the same tensor for the same shape (so the pattern cache can reuse it)."""
    return _all_nodes_cached(b, n, str(device))


def attend_csr(core, query, key, value, inputs: AttentionInputs, scores=None) -> AttentionOutput:
    """The ``"csr"`` kernel: the core's edge attention (:meth:`EdgeAttention.attend_edges`) over the cached
    CSR pattern of the call's edges, with self loops on every real node under ``add_self_loops`` (padded
    nodes get none: they must stay unread). ``scores``: ``(core, query, key, pattern, edge_attr) -> (E h,)``
    in place of the core's ``_edge_scores`` (GATv2's chunked Function)."""
    b, _, n, _ = query.shape
    loop_mask = None
    if core.config.add_self_loops:
        mask = inputs.attention_mask
        loop_mask = mask if mask is not None else _all_nodes(b, n, query.device)
    edge_index = inputs.edges.edge_index.to(query.device)
    pattern = EdgePattern.of(edge_index, b * n, core.num_heads, loop_mask)
    return core.attend_edges(query, key, value, inputs, pattern, scores)


CSR_KERNEL = Kernel("csr", attend_csr)
