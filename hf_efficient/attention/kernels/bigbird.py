"""BigBird's kernels: the block-sparse rows and the dense global rows with recomputing backwards
("native"), and the layout as one FlexAttention block mask ("flex").

Both compute :meth:`~hf_efficient.attention.bigbird.BigBirdAttention.reference` on the core's own layout
(``core.layout_for``: the random blocks are the core's, shared by every path).

``"native"`` runs wherever the call is not traced; ``"auto"`` takes it whenever FlexAttention does not
serve the call. Its two autograd functions never hold an n x n tensor nor a (w + g + r) x n copy of K/V:

* :class:`_BlockSparseSoftmax`: the sparse rows, a chunk of query blocks at a time: it gathers the key
  and value blocks of the chunk's slots, takes one softmax over them and, in backward, gathers again
  (flash-style) instead of saving the gathered copies;
* :class:`_DenseRows`: the global query blocks against every key, a group of (example, head) pairs at a
  time, recomputing their scores in backward. It replaces sdpa there because torch's CPU flash backward
  runs these skinny rows (G B queries, n keys) well below the matmul rate.

A chunk's intermediates stay within ``CHUNK_BUDGET`` bytes each (a module attribute, so tests can make
several chunks of small inputs). Every chunk-sized result goes into a reused buffer
(:class:`~hf_efficient.attention.utils.ChunkBuffers`). Dropout draws each chunk's mask from a seeded
generator, so backward redraws the same one.

``"flex"`` (``"auto"`` on CUDA, as for every FlexAttention kernel: :data:`.flex.FLEX_DEVICES`) lays the
layout out as a table of allowed block pairs; on a GPU a ``block_size`` that is a multiple of
``FLEX_BLOCK`` makes every layout block whole flex blocks, so no score looks the table up.
"""

from __future__ import annotations

import torch

from ...compat import softmax_backward
from ..base import AttentionOutput, Kernel
from ..utils import CHUNK_BYTES, ChunkBuffers, host_reads_are_cheap, rows_per_chunk
from .flex import (
    FLEX_DEVICES,
    BlockMask,
    blocks_all,
    blocks_holding,
    coarsen,
    flex_attend,
    flex_block_mask,
    flex_unsupported,
)

# Bytes of one chunk-sized intermediate. Backward holds about eight of them at once; a quarter of
# CHUNK_BYTES each keeps the peak near 2 * CHUNK_BYTES while the batched matmuls stay large.
CHUNK_BUDGET = CHUNK_BYTES // 4


def _dropout_keep(shape, p, seed, chunk, device) -> torch.Tensor:
    """The keep mask of one chunk: the same in forward and backward (seeded by the call and the chunk)."""
    generator = torch.Generator(device=device).manual_seed(seed + chunk)
    return torch.rand(shape, generator=generator, device=device) >= p


def _gather_blocks(blocks: torch.Tensor, index: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """(N, B, d) flat key/value blocks, (b, h, c, K) flat block ids -> ``out`` (b, h, c, K * B, d)."""
    torch.index_select(blocks, 0, index.reshape(-1), out=out.view(-1, *blocks.shape[1:]))
    return out


def _add_key_grads(grad, slot_grads, index, c0, num_window, global_index) -> None:
    """Add the gradients of a chunk's gathered key/value blocks into ``grad`` (b * h * nb, B * d).

    slot_grads (b, h, c, K, B * d) follow the layout's slot order (window, global, random). A slot carries
    a non-zero gradient only where it is used, so: window slot j of row i holds block i + j - half
    (shifted slice adds), global slots hold the same block in every row (summed over rows first), and only
    the random slots need an indexed add (``index_add_`` is slow on CPU).
    """
    b, h, c, _, width = slot_grads.shape
    per_block = grad.view(b, h, -1, width)  # (b, h, nb, B * d)
    nb, half = per_block.shape[2], num_window // 2
    for slot in range(num_window):
        shift = slot - half
        lo, hi = max(0, -shift - c0), min(c, nb - shift - c0)  # rows whose window block exists
        if hi > lo:
            per_block[:, :, c0 + lo + shift : c0 + hi + shift] += slot_grads[:, :, lo:hi, slot]
    end = num_window + global_index.shape[-1]
    if end > num_window:
        summed = slot_grads[:, :, :, num_window:end].sum(2)  # (b, h, G, B * d)
        grad.index_add_(0, global_index.reshape(-1), summed.reshape(-1, width))
    if slot_grads.shape[3] > end:
        grad.index_add_(0, index[..., end:].reshape(-1), slot_grads[:, :, :, end:].reshape(-1, width))


class _BlockSparseSoftmax(torch.autograd.Function):
    """Sparse rows: out = softmax(q K_S^T, over allowed keys) V_S per query block; backward recomputes."""

    @staticmethod
    def _gathered(t, index, buffers, name):
        """The key or value blocks of a chunk's slots, (b, h, c, K * B, d), in a reused buffer."""
        b, h, c, slots = index.shape
        return _gather_blocks(t, index, buffers(name, (b, h, c, slots * t.shape[1], t.shape[2])))

    @staticmethod
    def _probs(q, k, index, blocked, mask_rows, buffers):
        """Probabilities (b, h, c, B, K * B) of a chunk and its gathered keys (b, h, c, K * B, d)."""
        keys = _BlockSparseSoftmax._gathered(k, index, buffers, "keys")  # (b, h, c, K * B, d)
        shape = (*q.shape[:-1], keys.shape[-2])  # (b, h, c, B, K * B)
        scores = torch.matmul(q, keys.transpose(-1, -2), out=buffers("scores", shape))
        if mask_rows is not None:  # only the rows [lo, hi) of this chunk hold keys to exclude
            lo, hi = mask_rows
            scores[:, :, lo:hi].masked_fill_(blocked[:, :, lo:hi, None, :], torch.finfo(scores.dtype).min)
        return torch.softmax(scores, -1, out=buffers("probs", shape)), keys

    @staticmethod
    def forward(ctx, q, k, v, index, blocked, global_index, num_window, dropout_p):
        """q (b, h, nb, B, d) pre-scaled; k, v (b * h * nb, B, d); index (b, h, nb, K) flat block ids;
        blocked (b, h, nb, K * B) bool, True = key excluded; global_index (b, h, G) flat ids of the global
        slots. Returns (b, h, nb, B, d)."""
        b, h, nb, bs, d = q.shape
        row_bytes = b * h * index.shape[-1] * bs * max(bs, d) * q.element_size()
        step = rows_per_chunk(row_bytes, nb, CHUNK_BUDGET)
        mask_rows = _rows_to_mask(blocked, nb, step)
        seed = int(torch.randint(0, 2**62, (1,)).item()) if dropout_p > 0 else 0
        out, buffers = torch.empty_like(q), ChunkBuffers(q)
        for chunk, c0 in enumerate(range(0, nb, step)):
            rows = slice(c0, c0 + step)
            probs, _ = _BlockSparseSoftmax._probs(
                q[:, :, rows], k, index[:, :, rows], blocked[:, :, rows], mask_rows[chunk], buffers
            )
            values = _BlockSparseSoftmax._gathered(v, index[:, :, rows], buffers, "values")
            if dropout_p > 0:
                keep = _dropout_keep(probs.shape, dropout_p, seed, chunk, q.device)
                probs = probs.masked_fill_(~keep, 0.0).div_(1 - dropout_p)
            out[:, :, rows] = torch.matmul(probs, values)  # (b, h, c, B, d)
        ctx.save_for_backward(q, k, v, index, blocked, global_index)
        ctx.step, ctx.seed, ctx.dropout_p, ctx.mask_rows = step, seed, dropout_p, mask_rows
        ctx.num_window = num_window
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, index, blocked, global_index = ctx.saved_tensors
        add_grads = lambda grad, slots, c0, rows: _add_key_grads(
            grad.view(-1, bs * d),
            slots.view(b, h, -1, index.shape[-1], bs * d),
            index[:, :, rows],
            c0,
            ctx.num_window,
            global_index,
        )
        b, h, nb, bs, d = q.shape
        p_drop = ctx.dropout_p
        # Dense whatever the strides of k, v (they can arrive as strided views): add_grads views them flat.
        dense = torch.contiguous_format
        grad_q = torch.empty_like(q)
        grad_k, grad_v = torch.zeros_like(k, memory_format=dense), torch.zeros_like(v, memory_format=dense)
        buffers = ChunkBuffers(q)
        for chunk, c0 in enumerate(range(0, nb, ctx.step)):
            rows = slice(c0, c0 + ctx.step)
            probs, keys = _BlockSparseSoftmax._probs(
                q[:, :, rows], k, index[:, :, rows], blocked[:, :, rows], ctx.mask_rows[chunk], buffers
            )
            values = _BlockSparseSoftmax._gathered(v, index[:, :, rows], buffers, "values")
            grad_o = grad_out[:, :, rows]  # (b, h, c, B, d)
            grad_p = torch.matmul(grad_o, values.transpose(-1, -2), out=buffers("grad_p", probs.shape))
            used = probs
            if p_drop > 0:
                keep = _dropout_keep(probs.shape, p_drop, ctx.seed, chunk, q.device)
                used = probs.masked_fill(~keep, 0.0).div_(1 - p_drop)
                grad_p = grad_p.masked_fill_(~keep, 0.0).div_(1 - p_drop)
            # (b, h, c, K * B, d); the key gradients below reuse the same buffer once these are added.
            slot_grads = buffers("slot_grads", keys.shape)
            add_grads(grad_v, torch.matmul(used.transpose(-1, -2), grad_o, out=slot_grads), c0, rows)
            # p * (dp - rowsum(p dp)), (b, h, c, B, K * B)
            grad_s = softmax_backward(grad_p, probs, -1, out=buffers("grad_s", probs.shape))
            grad_q[:, :, rows] = torch.matmul(grad_s, keys)
            add_grads(grad_k, torch.matmul(grad_s.transpose(-1, -2), q[:, :, rows], out=slot_grads), c0, rows)
        return grad_q, grad_k, grad_v, None, None, None, None, None


def _rows_to_mask(blocked: torch.Tensor, nb: int, step: int) -> list[tuple[int, int] | None]:
    """Per chunk of ``step`` query blocks, the range [lo, hi) of its rows that hold keys to exclude
    (``blocked`` (b, h, nb, K * B)), None if none do. Found on the host where that is cheap (a CPU: only the
    edge blocks' rows get masked); on an accelerator every row is masked instead of reading ``blocked``."""
    starts = range(0, nb, step)
    if not host_reads_are_cheap(blocked):
        return [(0, min(step, nb - c0)) for c0 in starts]
    row_blocked = blocked.any(-1).any(1).any(0)  # (nb,): query blocks with keys to exclude
    mask_rows = []
    for c0 in starts:
        rows = torch.nonzero(row_blocked[c0 : c0 + step]).flatten().tolist()
        mask_rows.append((rows[0], rows[-1] + 1) if rows else None)
    return mask_rows


class _DenseRows(torch.autograd.Function):
    """Global query rows against every key: softmax(q K^T) V, one group of (example, head) pairs at a time;
    each group's (r, n) scores live in a reused buffer and are recomputed in backward."""

    @staticmethod
    def _probs(q, k, key_mask, buffers):
        """q (g, r, d) pre-scaled, k (g, n, d), key_mask (g, 1, n) bool or None -> probs (g, r, n)."""
        shape = (*q.shape[:-1], k.shape[-2])
        scores = torch.matmul(q, k.transpose(-1, -2), out=buffers("scores", shape))
        if key_mask is not None:
            scores.masked_fill_(~key_mask, torch.finfo(scores.dtype).min)
        return torch.softmax(scores, -1, out=buffers("probs", shape))

    @staticmethod
    def forward(ctx, q, k, v, key_mask, dropout_p):
        """q (G, r, d) pre-scaled, k and v (G, n, d), key_mask (G, 1, n) bool (True = real key) or None,
        for G = b * h. Returns (G, r, d)."""
        groups, rows, _ = q.shape
        step = rows_per_chunk(rows * k.shape[1] * q.element_size(), groups, CHUNK_BUDGET)
        seed = int(torch.randint(0, 2**62, (1,)).item()) if dropout_p > 0 else 0
        out, buffers = torch.empty_like(q), ChunkBuffers(q)
        for chunk, g0 in enumerate(range(0, groups, step)):
            part = slice(g0, g0 + step)
            probs = _DenseRows._probs(q[part], k[part], None if key_mask is None else key_mask[part], buffers)
            if dropout_p > 0:
                keep = _dropout_keep(probs.shape, dropout_p, seed, chunk, q.device)
                probs = probs.masked_fill_(~keep, 0.0).div_(1 - dropout_p)
            torch.matmul(probs, v[part], out=out[part])
        ctx.save_for_backward(q, k, v, key_mask)
        ctx.step, ctx.seed, ctx.dropout_p = step, seed, dropout_p
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, key_mask = ctx.saved_tensors
        grad_out, p_drop = grad_out.contiguous(), ctx.dropout_p
        grad_q, grad_k, grad_v = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        buffers = ChunkBuffers(q)
        for chunk, g0 in enumerate(range(0, q.shape[0], ctx.step)):
            part = slice(g0, g0 + ctx.step)
            probs = _DenseRows._probs(q[part], k[part], None if key_mask is None else key_mask[part], buffers)
            grad_o = grad_out[part]  # (g, r, d)
            grad_p = torch.matmul(grad_o, v[part].transpose(-1, -2), out=buffers("grad_p", probs.shape))
            used = probs
            if p_drop > 0:
                keep = _dropout_keep(probs.shape, p_drop, ctx.seed, chunk, q.device)
                used = probs.masked_fill(~keep, 0.0).div_(1 - p_drop)
                grad_p = grad_p.masked_fill_(~keep, 0.0).div_(1 - p_drop)
            torch.matmul(used.transpose(-1, -2), grad_o, out=grad_v[part])  # (g, n, d)
            grad_s = softmax_backward(grad_p, probs, -1, out=buffers("grad_s", probs.shape))
            torch.matmul(grad_s, k[part], out=grad_q[part])
            torch.matmul(grad_s.transpose(-1, -2), q[part], out=grad_k[part])
        return grad_q, grad_k, grad_v, None, None


def attend_native(core, query, key, value, inputs) -> AttentionOutput:
    """The reference's sparse and dense rows, each in its recomputing autograd function; the global rows
    are written into the sparse rows' output in place (the sparse function keeps no reference to it)."""
    return core.block_sparse(
        query, key, value, inputs, _BlockSparseSoftmax.apply, _DenseRows.apply, in_place=True
    )


def flex_mask(n: int, real: torch.Tensor | None, layout, block_size: int) -> BlockMask:
    """A batch layout (``core.layout_for``) as one FlexAttention block mask (batch dimension: the
    layout's); ``real`` (b, n) bool marks the real keys, or None.

    Each example's layout becomes a (h, nb, nb) table of allowed BigBird block pairs (global rows: every
    block up to the last real one); the token-level pattern looks it up, and the flex blocks are counted
    from it (``flex.coarsen``), so no n x n pattern is built.
    """
    b, h, nb, _ = layout.index.shape
    bs = block_size
    hits = torch.zeros(b, h, nb, nb, dtype=torch.int32, device=layout.index.device)
    allowed = hits.scatter_add_(-1, layout.index, layout.valid.int()) > 0  # (b, h, nb, nb)
    in_example = layout.valid.any(-1).any(1)  # (b, nb): blocks up to the example's last one
    allowed = allowed | (layout.is_global[:, None, :, None] & in_example[:, None, None, :])

    shared = allowed[0] if b == 1 else None  # one layout for every example (B = 1 mask)

    def mask_mod(batch, head, q, k):
        pair = (
            shared[head, q // bs, k // bs] if shared is not None else allowed[batch, head, q // bs, k // bs]
        )
        return pair & real[batch, k] if real is not None else pair

    partial, full = coarsen(allowed, bs, n)  # (b, h, fb, fb)
    if real is not None:
        partial = partial & blocks_holding(real)[:, None, None, :]
        full = full & blocks_all(real)[:, None, None, :]
    return flex_block_mask(partial, mask_mod, n, full=full)


def attend_flex(core, query, key, value, inputs) -> AttentionOutput:
    """The core's layout as a FlexAttention block mask; unpadded batches share one mask per length
    (every example has the same layout), cached on the core."""
    b, _, n, _ = query.shape
    attention_mask = inputs.attention_mask
    _, layout = core.layout_for(attention_mask, b, n, query.device)
    key_of = (n, str(query.device)) if attention_mask is None else None
    if attention_mask is None:
        layout = type(layout)(*(t[:1] for t in layout))
    block_mask = core.flex_masks.get(
        key_of, lambda: flex_mask(n, attention_mask, layout, core.config.block_size)
    )
    return AttentionOutput(flex_attend(query, key, value, block_mask, core.scaling), None)


FLEX = Kernel("flex", attend_flex, flex_unsupported, traces=True, devices=FLEX_DEVICES)
NATIVE = Kernel("native", attend_native)
