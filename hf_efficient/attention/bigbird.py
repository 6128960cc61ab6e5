"""BigBird block-sparse attention, ITC form (Zaheer et al. 2020, Big Bird: Transformers for Longer Sequences).

The sequence is cut into blocks of ``block_size`` tokens. A query block i attends to the key blocks

    S(i) = W(i) ∪ G ∪ R_h(i)        out_t = sum_{s in S(block(t))} softmax_s(q_t . k_s / sqrt(d)) v_s

W(i): ``num_window_blocks`` blocks centred on i (odd; 3 = i and one neighbour each side); G: the first
``num_global_blocks_start`` and last ``num_global_blocks_end`` blocks; R_h(i): ``num_random_blocks`` blocks
drawn per head from the blocks not in W(i) ∪ G (fewer when too few remain). Global query blocks attend to
every key (a few dense rows). Cost O(n (w + g + r) B d) time and O(n d) memory for block B: linear in n.
The sparse rows run in a custom autograd function that gathers the key/value blocks of a chunk of query
blocks, takes one softmax over them and, in backward, gathers again (flash-style) instead of saving the
gathered copies, so no n x n tensor and no (w + g + r) x n copy of K/V is ever held; the dense rows run in
another that recomputes their scores per (example, head) in backward.

Deviations from the paper and from transformers' ``BigBirdBlockSparseAttention``:
    * The pattern is laid over each example's positions 0..(last real token) rounded up to whole blocks,
      so right padding never changes it; the last global block is the last block holding a real token.
    * Any length works (padded inside); where window and global blocks overlap (short sequences) each key
      block is counted once, so with every block global the result is exactly full attention (transformers
      switches to full attention below (5 + 2 r) blocks and needs n to divide by the block size).
    * Random blocks are a deterministic function of (seed, layer_idx, number of blocks), fixed in training
      and eval (transformers re-seeds numpy with the layer index every training step, so its layout is also
      fixed in training, but in eval it points every random block at block 0, duplicating that global
      block). transformers also draws them only from the first 2r + 5 blocks and bars two extra blocks
      for rows 1 and -2; here they are drawn uniformly from all allowed blocks.
    * The draw is a 32-bit integer hash of (seed, layer, the example's number of blocks, head, query block,
      key block), and a row's random blocks are the r allowed key blocks of smallest hash: a pure tensor
      function of sizes, so the layout is built inside the graph and ``torch.export`` / ONNX Runtime give
      the same layout as eager PyTorch for every length (a ``torch.Generator`` draw per length cannot be
      traced). Every layout tensor is (b, h, nb, ...) from the per-example block counts; nothing is looped
      over in Python on the traced path.

Layout shapes: b batch, h heads, nb blocks of the padded batch, m_i blocks of example i (up to its last
real token), K = w + gs + ge + r key-block slots per query block, G = gs + ge global slots.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch

from .base import AttentionCapabilities, AttentionCore, AttentionOutput
from .config import AttentionConfig
from .kernels.flex import (
    BlockMask,
    BlockMaskCache,
    blocks_all,
    blocks_holding,
    check_implementation,
    coarsen,
    flex_attend,
    flex_block_mask,
    use_flex,
)
from .inputs import AttentionInputs, is_tracing
from .registry import register_attention
from .utils import CHUNK_BYTES, ChunkBuffers, extend_padding_mask, pad_to_multiple, rows_per_chunk, unpad


@dataclass
class BigBirdConfig(AttentionConfig):
    """Hyperparameters of BigBird (``attention_config``).

    Attributes:
        block_size: tokens per block B.
        num_window_blocks: sliding window width in blocks (odd; 3 = the block and one neighbour each side).
        num_global_blocks_start: global blocks at the start of the sequence (ITC: 1).
        num_global_blocks_end: global blocks at the end of the real tokens (ITC: 1).
        num_random_blocks: random key blocks per query block and head.
        seed: seeds the random layout together with the layer index and the number of blocks.
        implementation: ``"auto"`` (FlexAttention on CUDA without dropout, the native block-sparse path
            otherwise), ``"native"`` or ``"flex"`` (see :mod:`hf_efficient.attention.kernels.flex`). On a GPU use
            a block_size that is a multiple of 128 (FlexAttention's block): layout blocks are then whole flex
            blocks (73 TFLOP/s at 64k tokens on an H200, against 5 with 64-token blocks, whose flex blocks
            are all partial and look the layout up per score).
    """

    block_size: int = 64
    num_window_blocks: int = 3
    num_global_blocks_start: int = 1
    num_global_blocks_end: int = 1
    num_random_blocks: int = 3
    seed: int = 0
    implementation: str = "auto"

    def validate(self) -> None:
        check_implementation("bigbird", self.implementation)
        if self.block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {self.block_size}")
        if self.num_window_blocks < 1 or self.num_window_blocks % 2 == 0:
            raise ValueError(f"num_window_blocks must be odd and >= 1, got {self.num_window_blocks}")
        for name in ("num_global_blocks_start", "num_global_blocks_end", "num_random_blocks", "seed"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")


class BlockLayout(NamedTuple):
    """Key blocks of every query block of one example of m blocks (h heads, K = w + gs + ge + r slots).

    index: (h, m, K) key block of each slot; slots that are not used hold a valid block but are False in
    ``valid`` (h, m, K). global_blocks: sorted ids of the global blocks, whose rows are computed densely.
    """

    index: torch.Tensor
    valid: torch.Tensor
    global_blocks: tuple[int, ...]


class BatchLayout(NamedTuple):
    """The layouts of a batch, each example's laid over its own m_i blocks (rows past m_i keep no keys).

    index: (b, h, nb, K) key block of each slot (unused slots point at the row's own block); valid: (b, h,
    nb, K) bool. is_global: (b, nb) bool, the global blocks (dense rows). global_ids: (b, G) the global
    blocks in slot order (start blocks, then end blocks), global_used: (b, G) bool, the slots that are
    global blocks of the example (G = gs + ge; fewer are used when an example has few blocks).
    """

    index: torch.Tensor
    valid: torch.Tensor
    is_global: torch.Tensor
    global_ids: torch.Tensor
    global_used: torch.Tensor


_CACHED_LAYOUTS = 8  # batch layouts an eager core keeps
_MASK32 = 2**32 - 1
_NOT_DRAWN = 2**32  # rank of a key block that may not be drawn: above every hashed rank


def mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer hash of int64 values in [0, 2^32): xor-shift-multiply rounds, a bijection of
    [0, 2^32) (so distinct inputs never tie).

    Multipliers below 2^31 keep every product inside int64 and the shifts act on non-negative values, so
    torch eager, torch.export and ONNX Runtime compute the same bits.
    """
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & _MASK32
    x = x ^ (x >> 15)
    x = (x * 0x31848BAB) & _MASK32
    return x ^ (x >> 16)


def build_batch_layout(
    num_blocks: torch.Tensor,
    nb: int,
    num_window_blocks: int,
    num_global_start: int,
    num_global_end: int,
    random_blocks: torch.Tensor,
    random_valid: torch.Tensor,
) -> BatchLayout:
    """Window + global + given random key blocks per query block, each key block counted once.

    Args:
        num_blocks: (b,) long, m_i = blocks of example i; nb >= every m_i, the blocks of the padded batch.
        random_blocks: (b, h, nb, r) long random key block ids; random_valid: (b, h, nb, r) bool, which are
            used (slots pointing at window or global blocks are dropped here).
    """
    half, gs, ge = num_window_blocks // 2, num_global_start, num_global_end
    device = num_blocks.device
    b, heads = random_blocks.shape[:2]
    m = num_blocks[:, None, None]  # (b, 1, 1)
    rows = torch.arange(nb, device=device)[:, None]  # (nb, 1)
    blocks = torch.arange(nb, device=device)
    window = (rows + torch.arange(-half, half + 1, device=device)).expand(b, -1, -1)  # (b, nb, w)
    start = torch.arange(gs, device=device).expand(b, nb, -1)  # (b, nb, gs)
    end = m - ge + torch.arange(ge, device=device)  # (b, 1, ge)
    is_global = ((blocks < gs) | (blocks >= m[:, 0] - ge)) & (blocks < m[:, 0])  # (b, nb)
    fixed = torch.cat([window, start, end.expand(-1, nb, -1)], -1)  # (b, nb, w + gs + ge)
    fixed_ok = torch.cat(
        [
            (window >= 0) & (window < m),
            (start < m) & ((start - rows).abs() > half),
            (end >= gs) & ((end - rows).abs() > half),  # end blocks not already start blocks
        ],
        -1,
    )
    drawn_global = (
        is_global[:, None, None, :].expand(-1, heads, nb, -1).gather(-1, random_blocks.clamp(0, nb - 1))
    )
    random_ok = random_valid & ((random_blocks - rows).abs() > half) & ~drawn_global
    index = torch.cat([fixed[:, None].expand(-1, heads, -1, -1), random_blocks], -1)  # (b, h, nb, K)
    valid = torch.cat([fixed_ok[:, None].expand(-1, heads, -1, -1), random_ok], -1)
    valid = valid & (rows < m)[:, None]  # rows past the example's blocks keep no keys
    index = torch.where(valid, index, rows)  # unused slots point at a real block
    global_ids = torch.cat([start[:, 0], end[:, 0]], -1)  # (b, G)
    global_used = torch.cat([start[:, 0] < m[:, 0], end[:, 0] >= gs], -1)
    return BatchLayout(index, valid, is_global, global_ids.clamp(0, nb - 1), global_used)


def _gather_blocks(blocks: torch.Tensor, index: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """(N, B, d) flat key/value blocks, (b, h, c, K) flat block ids -> ``out`` (b, h, c, K * B, d)."""
    torch.index_select(blocks, 0, index.reshape(-1), out=out.view(-1, *blocks.shape[1:]))
    return out


def _add_key_grads(grad, slot_grads, index, c0, num_window, global_index) -> None:
    """Add the gradients of a chunk's gathered key/value blocks into ``grad`` (b * h * nb, B * d).

    slot_grads (b, h, c, K, B * d) follow the slot order of :func:`build_block_layout`. A slot carries a
    non-zero gradient only where it is used, so: window slot j of row i holds block i + j - half (shifted
    slice adds), global slots hold the same block in every row (summed over rows first), and only the
    random slots need an indexed add (``index_add_`` is slow on CPU).
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
    def _dropout_keep(shape, p, seed, chunk, device) -> torch.Tensor:
        generator = torch.Generator(device=device).manual_seed(seed + chunk)
        return torch.rand(shape, generator=generator, device=device) >= p

    @staticmethod
    def forward(ctx, q, k, v, index, blocked, global_index, num_window, dropout_p):
        """q (b, h, nb, B, d) pre-scaled; k, v (b * h * nb, B, d); index (b, h, nb, K) flat block ids;
        blocked (b, h, nb, K * B) bool, True = key excluded; global_index (b, h, G) flat ids of the global
        slots. Returns (b, h, nb, B, d)."""
        b, h, nb, bs, d = q.shape
        # Backward holds about eight chunk-sized tensors at once; a quarter of the budget each keeps the
        # peak near 2 * CHUNK_BYTES while the batched matmuls stay large.
        row_bytes = b * h * index.shape[-1] * bs * max(bs, d) * q.element_size()
        step = rows_per_chunk(row_bytes, nb, CHUNK_BYTES // 4)
        row_blocked = blocked.any(-1).any(1).any(0)  # (nb,): query blocks with keys to exclude
        mask_rows = []
        for c0 in range(0, nb, step):
            rows = torch.nonzero(row_blocked[c0 : c0 + step]).flatten().tolist()
            mask_rows.append((rows[0], rows[-1] + 1) if rows else None)
        seed = int(torch.randint(0, 2**62, (1,)).item()) if dropout_p > 0 else 0
        out, buffers = torch.empty_like(q), ChunkBuffers(q)
        for chunk, c0 in enumerate(range(0, nb, step)):
            rows = slice(c0, c0 + step)
            probs, _ = _BlockSparseSoftmax._probs(
                q[:, :, rows], k, index[:, :, rows], blocked[:, :, rows], mask_rows[chunk], buffers
            )
            values = _BlockSparseSoftmax._gathered(v, index[:, :, rows], buffers, "values")
            if dropout_p > 0:
                keep = _BlockSparseSoftmax._dropout_keep(probs.shape, dropout_p, seed, chunk, q.device)
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
            # Every chunk-sized result goes into a reused buffer (see ChunkBuffers).
            grad_p = torch.matmul(grad_o, values.transpose(-1, -2), out=buffers("grad_p", probs.shape))
            used = probs
            if p_drop > 0:
                keep = _BlockSparseSoftmax._dropout_keep(probs.shape, p_drop, ctx.seed, chunk, q.device)
                used = probs.masked_fill(~keep, 0.0).div_(1 - p_drop)
                grad_p = grad_p.masked_fill_(~keep, 0.0).div_(1 - p_drop)
            # (b, h, c, K * B, d); the key gradients below reuse the same buffer once these are added.
            slot_grads = buffers("slot_grads", keys.shape)
            add_grads(grad_v, torch.matmul(used.transpose(-1, -2), grad_o, out=slot_grads), c0, rows)
            grad_s = torch._softmax_backward_data(  # p * (dp - rowsum(p dp)), (b, h, c, B, K * B)
                grad_p, probs, -1, probs.dtype, grad_input=buffers("grad_s", probs.shape)
            )
            grad_q[:, :, rows] = torch.matmul(grad_s, keys)
            add_grads(grad_k, torch.matmul(grad_s.transpose(-1, -2), q[:, :, rows], out=slot_grads), c0, rows)
        return grad_q, grad_k, grad_v, None, None, None, None, None


class _DenseRows(torch.autograd.Function):
    """Global query rows against every key: softmax(q K^T) V, one group of (example, head) pairs at a time.

    Each group's (r, n) scores live in a reused buffer and are recomputed in backward. Replaces sdpa here
    because torch's CPU flash backward ran these skinny rows (r = 128 queries, n keys) at about half the
    matmul rate: 0.65-0.76 s of fwd+bwd at n = 16384 on one thread, a fifth of all of BigBird's time.
    """

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
        step = rows_per_chunk(rows * k.shape[1] * q.element_size(), groups, CHUNK_BYTES // 4)
        seed = int(torch.randint(0, 2**62, (1,)).item()) if dropout_p > 0 else 0
        out, buffers = torch.empty_like(q), ChunkBuffers(q)
        for chunk, g0 in enumerate(range(0, groups, step)):
            part = slice(g0, g0 + step)
            probs = _DenseRows._probs(q[part], k[part], None if key_mask is None else key_mask[part], buffers)
            if dropout_p > 0:
                keep = _BlockSparseSoftmax._dropout_keep(probs.shape, dropout_p, seed, chunk, q.device)
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
                keep = _BlockSparseSoftmax._dropout_keep(probs.shape, p_drop, ctx.seed, chunk, q.device)
                used = probs.masked_fill(~keep, 0.0).div_(1 - p_drop)
                grad_p = grad_p.masked_fill_(~keep, 0.0).div_(1 - p_drop)
            torch.matmul(used.transpose(-1, -2), grad_o, out=grad_v[part])  # (g, n, d)
            grad_s = torch._softmax_backward_data(
                grad_p, probs, -1, probs.dtype, grad_input=buffers("grad_s", probs.shape)
            )
            torch.matmul(grad_s, k[part], out=grad_q[part])
            torch.matmul(grad_s.transpose(-1, -2), q[part], out=grad_k[part])
        return grad_q, grad_k, grad_v, None, None


@register_attention("bigbird")
class BigBirdAttention(AttentionCore):
    config_class = BigBirdConfig
    capabilities = AttentionCapabilities()
    paper = "Zaheer et al. 2020, Big Bird: Transformers for Longer Sequences (ITC)"
    cost = "O(n·b·(w+r+g))"
    summary = "blocks: window + global + seeded random blocks"
    small_config = {"block_size": 4, "num_window_blocks": 3, "num_random_blocks": 2}

    @classmethod
    def forward_flops(cls, n, head_dim, config, num_edges=None):
        """4 d B^2 (g nb + (nb - g) min(nb, w + g + r)): g global blocks dense, other rows w + g + r
        blocks."""
        bs = config.block_size
        nb = -(-n // bs)
        num_global = min(nb, config.num_global_blocks_start + config.num_global_blocks_end)
        per_row = min(nb, config.num_window_blocks + num_global + config.num_random_blocks)
        return 4.0 * head_dim * bs * bs * (num_global * nb + (nb - num_global) * per_row)

    def __init__(self, spec, config=None):
        super().__init__(spec, config)
        # Eager mode keeps the last few batch layouts (keyed by the examples' block counts): a batch of long
        # inputs repeats its counts, and a layout costs O(b h nb^2). Traced graphs build theirs inside.
        self.layouts: dict[tuple, BatchLayout] = {}
        self.flex_masks = BlockMaskCache()  # FlexAttention masks of unpadded lengths, rebuilt on demand

    def init_weights(self) -> None:
        """No parameters; the layout is a function of (seed, layer_idx, number of blocks), rebuilt lazily."""
        self.layouts.clear()
        self.flex_masks.store.clear()

    def random_key_blocks(self, num_blocks: torch.Tensor, nb: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Random key blocks (b, h, nb, r) of every query block and (b, h, nb, r) bool of those drawn.

        Each row takes the r blocks of smallest rank among those outside its window, the global blocks and
        its example's m_i blocks (fewer when fewer remain): a uniform random subset. A rank is the hash
        ``mix32`` of (seed, layer, m_i, head, row, key block), distinct within a row (mix32 is a bijection).
        Cost O(b h nb^2) integer operations, small beside the attention (nb = n / block_size).
        """
        cfg, device = self.config, num_blocks.device
        r, half = cfg.num_random_blocks, cfg.num_window_blocks // 2
        m = num_blocks[:, None, None, None]  # (b, 1, 1, 1)
        heads = torch.arange(self.num_heads, device=device)[:, None, None]  # (h, 1, 1)
        rows = torch.arange(nb, device=device)[:, None]  # (nb, 1)
        cols = torch.arange(nb, device=device)  # (nb,)
        seed = (cfg.seed * 1_000_003 + self.spec.layer_idx) & _MASK32
        row_key = mix32(mix32(mix32(m ^ seed) ^ heads) ^ rows)  # (b, h, nb, 1)
        is_global = (cols < cfg.num_global_blocks_start) | (cols >= m - cfg.num_global_blocks_end)
        forbidden = ((cols - rows).abs() <= half) | is_global | (cols >= m)  # (b, 1, nb, nb)
        rank = mix32(row_key ^ cols).masked_fill(forbidden, _NOT_DRAWN)  # (b, h, nb, nb)
        rank = torch.cat([rank, rank.new_full((*rank.shape[:3], r), _NOT_DRAWN)], -1)  # r candidates at least
        drawn, picks = rank.topk(r, dim=-1, largest=False)  # (b, h, nb, r)
        return picks, drawn < _NOT_DRAWN

    def batch_layout(self, num_blocks: torch.Tensor, nb: int) -> BatchLayout:
        """The layouts of a batch whose example i holds ``num_blocks[i]`` blocks, padded to nb blocks."""
        if is_tracing():
            return self._build_batch_layout(num_blocks, nb)
        key = (tuple(num_blocks.tolist()), nb, str(num_blocks.device))
        if key not in self.layouts:
            if len(self.layouts) >= _CACHED_LAYOUTS:
                del self.layouts[next(iter(self.layouts))]  # the oldest
            self.layouts[key] = self._build_batch_layout(num_blocks, nb)
        return self.layouts[key]

    def _build_batch_layout(self, num_blocks: torch.Tensor, nb: int) -> BatchLayout:
        cfg = self.config
        picks, drawn = self.random_key_blocks(num_blocks, nb)
        return build_batch_layout(
            num_blocks,
            nb,
            cfg.num_window_blocks,
            cfg.num_global_blocks_start,
            cfg.num_global_blocks_end,
            picks,
            drawn,
        )

    def block_layout(self, num_blocks: int, device: torch.device | str = "cpu") -> BlockLayout:
        """The layout of one example of ``num_blocks`` blocks (the same as inside any batch)."""
        layout = self._build_batch_layout(torch.tensor([num_blocks], device=device), num_blocks)
        global_blocks = tuple(torch.nonzero(layout.is_global[0]).flatten().tolist())
        return BlockLayout(layout.index[0], layout.valid[0], global_blocks)

    def _attend(self, query, key, value, inputs: AttentionInputs) -> AttentionOutput:
        attention_mask = inputs.attention_mask
        b, h, n, d = query.shape
        bs = self.config.block_size
        mask = extend_padding_mask(attention_mask, b, n, bs, query.device)  # (b, nb * B) or None
        q, k, v = (pad_to_multiple(t, bs) for t in (query * self.scaling, key, value))  # (b, h, nb * B, d)
        nb = q.shape[2] // bs
        if mask is None:
            num_blocks = torch.full((b,), nb, device=query.device)
        else:  # blocks up to the last real token of each example
            last = (mask * torch.arange(1, nb * bs + 1, device=mask.device)).amax(-1)
            num_blocks = (last + bs - 1) // bs  # (b,)
        layout = self.batch_layout(num_blocks, nb)
        dropout = self.spec.dropout if self.training else 0.0
        if use_flex(self.config.implementation, query, dropout):
            # unpadded: every example has the same layout, one mask per length
            key_of = (n, str(query.device)) if attention_mask is None else None
            if attention_mask is None:
                layout = BatchLayout(*(t[:1] for t in layout))
            flex_mask = self.flex_masks.get(key_of, lambda: self._flex_mask(n, attention_mask, layout))
            return AttentionOutput(flex_attend(query, key, value, flex_mask, self.scaling), None)
        index, blocked, global_index = self._batch_index(layout, mask, b, nb)
        q_blocks = q.view(b, h, nb, bs, d)  # (b, h, nb, B, d)
        sparse_rows = _block_sparse_rows if is_tracing() else _BlockSparseSoftmax.apply
        out = sparse_rows(
            q_blocks,
            k.reshape(-1, bs, d),
            v.reshape(-1, bs, d),
            index,
            blocked,
            global_index,
            self.config.num_window_blocks,
            dropout,
        )  # (b, h, nb, B, d)
        out = self._global_rows(out, q_blocks, k, v, mask, layout, dropout)
        return AttentionOutput(unpad(out.view(b, h, nb * bs, d), n), None)

    def _flex_mask(self, n, real, layout: BatchLayout) -> BlockMask:
        """The same layouts as one FlexAttention block mask (batch dimension: the layout's).

        Each example's layout becomes a (h, nb, nb) table of allowed BigBird block pairs (global rows: every
        block up to the last real one); the token-level pattern looks it up, and the flex blocks are counted
        from it (``flex.coarsen``), so no n x n pattern is built.
        """
        b, h, nb, _ = layout.index.shape
        bs = self.config.block_size
        hits = torch.zeros(b, h, nb, nb, dtype=torch.int32, device=layout.index.device)
        allowed = hits.scatter_add_(-1, layout.index, layout.valid.int()) > 0  # (b, h, nb, nb)
        in_example = layout.valid.any(-1).any(1)  # (b, nb): blocks up to the example's last one
        allowed = allowed | (layout.is_global[:, None, :, None] & in_example[:, None, None, :])

        shared = allowed[0] if b == 1 else None  # one layout for every example (B = 1 mask)

        def mask_mod(batch, head, q, k):
            pair = (
                shared[head, q // bs, k // bs]
                if shared is not None
                else allowed[batch, head, q // bs, k // bs]
            )
            return pair & real[batch, k] if real is not None else pair

        partial, full = coarsen(allowed, bs, n)  # (b, h, fb, fb)
        if real is not None:
            partial = partial & blocks_holding(real)[:, None, None, :]
            full = full & blocks_all(real)[:, None, None, :]
        return flex_block_mask(partial, mask_mod, n, full=full)

    def _batch_index(
        self, layout: BatchLayout, mask, b, nb
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Flat ids into (b * h * nb) blocks of the key blocks (b, h, nb, K) and of the global slots
        (b, h, G), and the excluded keys (b, h, nb, K * B)."""
        h, bs, device = self.num_heads, self.config.block_size, layout.index.device
        index = layout.index  # (b, h, nb, K)
        slots = index.shape[-1]
        allowed = layout.valid[..., None].expand(b, h, nb, slots, bs)  # (b, h, nb, K, B)
        if mask is not None:
            example = torch.arange(b, device=device).view(b, 1, 1, 1) * nb
            allowed = allowed & mask.view(b * nb, bs)[index + example]  # (b, h, nb, K, B)
        offset = torch.arange(b * h, device=device).view(b, h, 1) * nb  # (b, h, 1): first block of (b, h)
        global_index = layout.global_ids[:, None, :] + offset  # (b, h, G); unused ones carry no gradient
        return index + offset[..., None], ~allowed.reshape(b, h, nb, slots * bs), global_index

    def _global_rows(self, out, q_blocks, k, v, mask, layout: BatchLayout, dropout) -> torch.Tensor:
        """Replace the rows of global query blocks by dense attention over all (real) keys."""
        b, h, nb, bs, d = q_blocks.shape
        ids, used, is_global = (
            layout.global_ids,
            layout.global_used,
            layout.is_global,
        )  # (b, G), (b, G), (b, nb)
        count = ids.shape[1]
        if count == 0:
            return out
        gather = ids[:, None, :, None, None].expand(b, h, count, bs, d)
        q_global = q_blocks.gather(2, gather).reshape(b, h, count * bs, d)  # (b, h, G * B, d)
        n = k.shape[2]
        key_mask = None if mask is None else mask[:, None, None, :].expand(b, h, 1, n).reshape(b * h, 1, n)
        dense_rows = _dense_rows if is_tracing() else _DenseRows.apply
        dense = dense_rows(
            q_global.reshape(b * h, count * bs, d),
            k.reshape(b * h, n, d),
            v.reshape(b * h, n, d),
            key_mask,
            dropout,
        ).view(b, h, count, bs, d)  # (b, h, G, B, d)
        dense = dense.masked_fill(~used[:, None, :, None, None], 0.0)  # unused slots (duplicates) add nothing
        fill = is_global[:, None, :, None, None]
        if is_tracing():  # out of place: there the sparse rows are an ordinary autograd output
            return out.masked_fill(fill, 0.0).scatter_add(2, gather, dense)
        # In place: the sparse function keeps no reference to its output.
        return out.masked_fill_(fill, 0.0).scatter_add_(2, gather, dense)


def _block_sparse_rows(q, k, v, index, blocked, global_index, num_window, dropout_p) -> torch.Tensor:
    """What :class:`_BlockSparseSoftmax` computes, in one piece with plain autograd (for traced graphs):
    q (b, h, nb, B, d) pre-scaled, k and v (b * h * nb, B, d), index (b, h, nb, K) flat block ids, blocked
    (b, h, nb, K * B) -> (b, h, nb, B, d). Memory O(n (K B) ) per head: the gathered keys and the scores."""
    b, h, nb, bs, d = q.shape
    keys = k.index_select(0, index.reshape(-1)).view(b, h, nb, -1, d)  # (b, h, nb, K * B, d)
    values = v.index_select(0, index.reshape(-1)).view(b, h, nb, -1, d)
    scores = (q @ keys.transpose(-1, -2)).masked_fill(blocked[:, :, :, None, :], torch.finfo(q.dtype).min)
    probs = torch.softmax(scores, -1)
    if dropout_p > 0:
        probs = torch.nn.functional.dropout(probs, dropout_p)
    return probs @ values  # (b, h, nb, B, d)


def _dense_rows(q, k, v, key_mask, dropout_p) -> torch.Tensor:
    """What :class:`_DenseRows` computes, in one piece with plain autograd (for traced graphs): q (G, r, d)
    pre-scaled, k and v (G, n, d), key_mask (G, 1, n) bool or None -> (G, r, d)."""
    scores = q @ k.transpose(-1, -2)  # (G, r, n)
    if key_mask is not None:
        scores = scores.masked_fill(~key_mask, torch.finfo(scores.dtype).min)
    probs = torch.softmax(scores, -1)
    if dropout_p > 0:
        probs = torch.nn.functional.dropout(probs, dropout_p)
    return probs @ v
