"""BigBird's block layout (:mod:`.bigbird`): which key blocks each query block of an example attends to.

Slots in the order window, start, end, random; an example of m blocks lays its pattern over its own blocks
(rows past m keep no keys). Shapes: b batch, h heads, nb blocks of the padded batch, K key-block slots per
query block, r random blocks, G global slots. ``config`` is the core's ``BigBirdConfig`` (typed by its
base here: this module sits below ``bigbird.py``, which imports it).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from .config import AttentionConfig
from .utils import MASK32, mix32

_NOT_DRAWN = 2**32  # rank of a key block that may not be drawn: above every hashed rank (mix32's < 2^32)


class BlockLayout(NamedTuple):
    """Key blocks of every query block of one example of m blocks: index (h, m, K) key block of each
    slot; valid (h, m, K), False for unused slots (which hold a valid block); global_blocks: sorted ids of
    the global blocks, whose rows are computed densely."""

    index: torch.Tensor
    valid: torch.Tensor
    global_blocks: tuple[int, ...]


class BatchLayout(NamedTuple):
    """Each example's layout over its own m_i blocks (rows past m_i keep no keys). index (b, h, nb, K):
    slots in the order window, start, end, random (unused ones point at the row's own block); valid (b, h,
    nb, K) bool; is_global (b, nb) bool; global_ids (b, G) the global blocks in slot order; global_used
    (b, G) bool, the slots that are global blocks of the example (fewer when an example has few blocks)."""

    index: torch.Tensor
    valid: torch.Tensor
    is_global: torch.Tensor
    global_ids: torch.Tensor
    global_used: torch.Tensor


def random_key_blocks(
    config: AttentionConfig, num_heads: int, layer_idx: int, num_blocks: torch.Tensor, nb: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Random key blocks (b, h, nb, r) of every query block and (b, h, nb, r) bool of those drawn: the
    r blocks of smallest rank ``mix32`` (seed, layer, m_i, head, row, key block) outside the row's
    window, the global blocks and the example's m_i blocks (a uniform subset). O(b h nb^2) integer ops."""
    cfg, device = config, num_blocks.device
    r, half = cfg.num_random_blocks, cfg.num_window_blocks // 2
    m = num_blocks[:, None, None, None]  # (b, 1, 1, 1)
    heads = torch.arange(num_heads, device=device)[:, None, None]  # (h, 1, 1)
    rows = torch.arange(nb, device=device)[:, None]  # (nb, 1)
    cols = torch.arange(nb, device=device)  # (nb,)
    seed = (cfg.seed * 1_000_003 + layer_idx) & MASK32
    row_key = mix32(mix32(mix32(m ^ seed) ^ heads) ^ rows)  # (b, h, nb, 1)
    is_global = (cols < cfg.num_global_blocks_start) | (cols >= m - cfg.num_global_blocks_end)
    forbidden = ((cols - rows).abs() <= half) | is_global | (cols >= m)  # (b, 1, nb, nb)
    rank = mix32(row_key ^ cols).masked_fill(forbidden, _NOT_DRAWN)  # (b, h, nb, nb)
    rank = torch.cat([rank, rank.new_full((*rank.shape[:3], r), _NOT_DRAWN)], -1)  # r candidates at least
    drawn, picks = rank.topk(r, dim=-1, largest=False)  # (b, h, nb, r)
    return picks, drawn < _NOT_DRAWN


def build_batch_layout(
    config: AttentionConfig,
    num_blocks: torch.Tensor,
    nb: int,
    random_blocks: torch.Tensor,
    random_valid: torch.Tensor,
) -> BatchLayout:
    """Window + global + random key blocks per query block, each key block counted once; num_blocks (b,)
    the m_i <= nb, random_blocks and random_valid (b, h, nb, r) as :func:`random_key_blocks` gives them."""
    cfg = config
    half, gs, ge = cfg.num_window_blocks // 2, cfg.num_global_blocks_start, cfg.num_global_blocks_end
    (b, heads), device = random_blocks.shape[:2], num_blocks.device
    m = num_blocks[:, None, None]  # (b, 1, 1)
    rows = torch.arange(nb, device=device)[:, None]  # (nb, 1)
    blocks = torch.arange(nb, device=device)
    window = (rows + torch.arange(-half, half + 1, device=device)).expand(b, -1, -1)  # (b, nb, w)
    start = torch.arange(gs, device=device).expand(b, nb, -1)  # (b, nb, gs)
    end = m - ge + torch.arange(ge, device=device)  # (b, 1, ge)
    is_global = ((blocks < gs) | (blocks >= m[:, 0] - ge)) & (blocks < m[:, 0])  # (b, nb)
    fixed = torch.cat([window, start, end.expand(-1, nb, -1)], -1)  # (b, nb, w + gs + ge)
    window_ok, start_ok = (window >= 0) & (window < m), (start < m) & ((start - rows).abs() > half)
    end_ok = (end >= gs) & ((end - rows).abs() > half)  # end blocks that are not start blocks too
    fixed_ok = torch.cat([window_ok, start_ok, end_ok], -1)  # (b, nb, w + gs + ge)
    global_of = is_global[:, None, None, :].expand(-1, heads, nb, -1)  # (b, h, nb, nb)
    drawn_global = global_of.gather(-1, random_blocks.clamp(0, nb - 1))
    random_ok = random_valid & ((random_blocks - rows).abs() > half) & ~drawn_global
    index = torch.cat([fixed[:, None].expand(-1, heads, -1, -1), random_blocks], -1)  # (b, h, nb, K)
    valid = torch.cat([fixed_ok[:, None].expand(-1, heads, -1, -1), random_ok], -1)
    valid = valid & (rows < m)[:, None]  # rows past the example's blocks keep no keys
    index = torch.where(valid, index, rows)  # unused slots point at a real block
    global_ids = torch.cat([start[:, 0], end[:, 0]], -1)  # (b, G)
    global_used = torch.cat([start[:, 0] < m[:, 0], end[:, 0] >= gs], -1)
    return BatchLayout(index, valid, is_global, global_ids.clamp(0, nb - 1), global_used)
