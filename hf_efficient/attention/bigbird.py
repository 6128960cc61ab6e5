"""BigBird block-sparse attention, ITC form (Zaheer et al. 2020, Big Bird: Transformers for Longer Sequences).

The sequence is cut into blocks of ``block_size`` tokens B. A query block i attends to the key blocks

    S(i) = W(i) ∪ G ∪ R_h(i)        out_t = sum_{s in S(block(t))} softmax_s(q_t . k_s / sqrt(d)) v_s

W(i): ``num_window_blocks`` blocks centred on i (odd; 3 = i and one neighbour each side); G: the first
``num_global_blocks_start`` and last ``num_global_blocks_end`` blocks; R_h(i): ``num_random_blocks`` blocks
drawn per head from the blocks not in W(i) ∪ G (fewer when too few remain). Global query blocks attend to
every key (a few dense rows). The reference gathers the K = |S(i)| key blocks of every query block: cost
O(n K B d) time and O(n K (B + d)) memory, linear in n. Its kernels (:mod:`.kernels.bigbird`): the same.

Deviations from the paper and from transformers' ``BigBirdBlockSparseAttention``:
    * The pattern is laid over each example's positions 0..(last real token) rounded up to whole blocks,
      so right padding never changes it; the last global block is the last block holding a real token.
    * Any length works (padded inside); where window and global blocks overlap (short sequences) each key
      block is counted once, so with every block global the result is exactly full attention (transformers
      switches to full attention below (5 + 2 r) blocks and needs n to divide by the block size).
    * A row's random blocks are the r allowed key blocks of smallest 32-bit hash of (seed, layer, the
      example's number of blocks, head, query block, key block): uniform, the same in training and eval,
      and a pure tensor function of sizes, so ``torch.export`` / ONNX Runtime build eager PyTorch's layout
      for every length. (transformers re-seeds numpy with the layer index every training step, draws only
      from the first 2r + 5 blocks, bars two more for rows 1 and -2, and in eval points every random block
      at block 0, duplicating that global block.)

Layout shapes: b batch, h heads, nb blocks of the padded batch, m_i blocks of example i (up to its last
real token), K = w + gs + ge + r key-block slots per query block, G = gs + ge global slots.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ._bigbird_layout import BatchLayout, BlockLayout, build_batch_layout, random_key_blocks
from .base import ROTATE_QUERIES_AND_KEYS, AttentionCapabilities, AttentionCore, AttentionOutput
from .config import AttentionConfig
from .dropout import fast_dropout
from .inputs import AttentionInputs, is_tracing
from .kernels.bigbird import FLEX, NATIVE
from .kernels.flex import BlockMaskCache
from .registry import register_attention
from .utils import extend_padding_mask, pad_to_multiple, unpad


@dataclass
class BigBirdConfig(AttentionConfig):
    """Hyperparameters of BigBird (``attention_config``).

    Attributes:
        block_size: tokens per block B. On a GPU use a multiple of 128 (FlexAttention's block): other
            sizes leave every flex block partial, looking the layout up per score.
        num_window_blocks: sliding window width in blocks (odd; 3 = the block and one neighbour each side).
        num_global_blocks_start: global blocks at the start of the sequence (ITC: 1).
        num_global_blocks_end: global blocks at the end of the real tokens (ITC: 1).
        num_random_blocks: random key blocks per query block and head.
        seed: seeds the random layout together with the layer index and the number of blocks.
        implementation: ``"auto"``, ``"reference"``, ``"native"`` or ``"flex"`` (:mod:`.kernels.bigbird`).
    """

    block_size: int = 64
    num_window_blocks: int = 3
    num_global_blocks_start: int = 1
    num_global_blocks_end: int = 1
    num_random_blocks: int = 3
    seed: int = 0

    def validate(self) -> None:
        if self.block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {self.block_size}")
        if self.num_window_blocks < 1 or self.num_window_blocks % 2 == 0:
            raise ValueError(f"num_window_blocks must be odd and >= 1, got {self.num_window_blocks}")
        for name in ("num_global_blocks_start", "num_global_blocks_end", "num_random_blocks", "seed"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")


_CACHED_LAYOUTS = 8  # batch layouts an eager core keeps


def block_sparse_rows(q, k, v, index, blocked, global_index, num_window, dropout_p) -> torch.Tensor:
    """Each query block against the key blocks of its slots: q (b, h, nb, B, d) pre-scaled, k and v
    (b * h * nb, B, d) flat blocks, index (b, h, nb, K) flat block ids, blocked (b, h, nb, K * B) True =
    key excluded -> (b, h, nb, B, d). (global_index, num_window: what the native kernel's backward reads.)"""
    b, h, nb, bs, d = q.shape
    keys = k.index_select(0, index.reshape(-1)).view(b, h, nb, -1, d)  # (b, h, nb, K * B, d)
    values = v.index_select(0, index.reshape(-1)).view(b, h, nb, -1, d)
    scores = (q @ keys.transpose(-1, -2)).masked_fill(blocked[:, :, :, None, :], torch.finfo(q.dtype).min)
    probs = torch.softmax(scores, -1)  # (b, h, nb, B, K * B)
    probs = fast_dropout(probs, dropout_p)
    return probs @ values  # (b, h, nb, B, d)


def dense_rows(q, k, v, key_mask, dropout_p) -> torch.Tensor:
    """Global query rows against every key: q (G, r, d) pre-scaled, k and v (G, n, d), key_mask (G, 1, n)
    bool (True = real key) or None -> (G, r, d)."""
    scores = q @ k.transpose(-1, -2)  # (G, r, n)
    if key_mask is not None:
        scores = scores.masked_fill(~key_mask, torch.finfo(scores.dtype).min)
    probs = torch.softmax(scores, -1)
    return fast_dropout(probs, dropout_p) @ v


# The scripts' blocks (config families text and listops; the others change a few): 3 window blocks, the
# first and last global, 2 random.
_BLOCKS_OF_32 = {
    "block_size": 32,
    "num_window_blocks": 3,
    "num_global_blocks_start": 1,
    "num_global_blocks_end": 1,
    "num_random_blocks": 2,
}


@register_attention("bigbird")
class BigBirdAttention(AttentionCore):
    config_class = BigBirdConfig
    kernels = (FLEX, NATIVE)  # "auto": FlexAttention on CUDA, the native kernels elsewhere (not traced)
    cross_attention_refusal = (
        "its blocks pair each query block with the key blocks at the same and chosen positions of one "
        "sequence (window, global and random blocks), so a decoder's queries have no blocks in the "
        "encoder's sequence"
    )
    relative_positions_refusal = (
        "its kernels gather key blocks (window, global, per-head random) per query block and add no score of "
        "their own to them; relative scores are built for the window of longformer"
    )
    capabilities = AttentionCapabilities(rotary=ROTATE_QUERIES_AND_KEYS)
    paper = "Zaheer et al. 2020, Big Bird: Transformers for Longer Sequences (ITC)"
    cost = "O(n·b·(w+r+g))"
    summary = "blocks: window + global + seeded random blocks"
    small_config = {"block_size": 4, "num_window_blocks": 3, "num_random_blocks": 2}
    benchmark_config = {"block_size": 64}  # the blocks BigBird's paper runs long inputs with
    export_note = (
        "random blocks drawn in the graph from each example's length (a hash of seed, layer, blocks)"
    )
    lra_listops = ("BigBird", 36.05)
    script_configs = {  # mqar: blocks of 8 (the default 64 would be full attention at 64 tokens)
        "text": {"attention_config": _BLOCKS_OF_32},
        "listops": {"attention_config": _BLOCKS_OF_32},
        "mqar": {"attention_config": {**_BLOCKS_OF_32, "block_size": 8, "num_random_blocks": 1}},
        "vision": {
            "attention_config": {
                **_BLOCKS_OF_32,
                "block_size": 5,
                "num_global_blocks_end": 0,
                "num_random_blocks": 1,
            }
        },
    }

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

    def covered_length(self) -> int | None:
        """Inputs of at most ``num_global_blocks_start + num_global_blocks_end`` blocks are global blocks
        only, which attend densely: exact attention."""
        config = self.config
        blocks = config.num_global_blocks_start + config.num_global_blocks_end
        return blocks * config.block_size if blocks else None

    def init_weights(self) -> None:
        """No parameters; the layout is a function of (seed, layer_idx, number of blocks), rebuilt lazily."""
        self.layouts.clear()
        self.flex_masks.store.clear()

    def random_key_blocks(self, num_blocks: torch.Tensor, nb: int) -> tuple[torch.Tensor, torch.Tensor]:
        """This core's random key blocks (b, h, nb, r) and which were drawn (:func:`random_key_blocks`)."""
        return random_key_blocks(self.config, self.num_heads, self.spec.layer_idx, num_blocks, nb)

    def batch_layout(
        self, num_blocks: torch.Tensor, nb: int, known: tuple[int, ...] | None = None
    ) -> BatchLayout:
        """The layouts of a batch whose example i holds ``num_blocks[i]`` blocks, padded to nb blocks;
        ``known``: the same counts as Python ints where the caller has them (no read from the device)."""
        if is_tracing():
            return self._build_batch_layout(num_blocks, nb)
        key = (known or tuple(num_blocks.tolist()), nb, str(num_blocks.device))
        if key not in self.layouts:
            if len(self.layouts) >= _CACHED_LAYOUTS:
                del self.layouts[next(iter(self.layouts))]  # the oldest
            self.layouts[key] = self._build_batch_layout(num_blocks, nb)
        return self.layouts[key]

    def _build_batch_layout(self, num_blocks: torch.Tensor, nb: int) -> BatchLayout:
        return build_batch_layout(self.config, num_blocks, nb, *self.random_key_blocks(num_blocks, nb))

    def block_layout(self, num_blocks: int, device: torch.device | str = "cpu") -> BlockLayout:
        """The layout of one example of ``num_blocks`` blocks (the same as inside any batch)."""
        layout = self._build_batch_layout(torch.tensor([num_blocks], device=device), num_blocks)
        global_blocks = tuple(torch.nonzero(layout.is_global[0]).flatten().tolist())
        return BlockLayout(layout.index[0], layout.valid[0], global_blocks)

    def layout_for(self, attention_mask, b: int, n: int, device) -> tuple[torch.Tensor | None, BatchLayout]:
        """The key mask (b, nb * B) of the padded batch (None: nothing padded) and the batch's layout, each
        example's laid over its blocks up to its last real token."""
        bs = self.config.block_size
        mask = extend_padding_mask(attention_mask, b, n, bs, device)
        nb = (n + bs - 1) // bs  # the form pad_to_multiple's traced length takes: export proves them equal
        if mask is None:  # every example fills the nb blocks: the cache key is known without a device read
            known = None if is_tracing() else (nb,) * b
            return None, self.batch_layout(torch.full((b,), nb, device=device), nb, known)
        last = (mask * torch.arange(1, nb * bs + 1, device=mask.device)).amax(-1)
        num_blocks = (last + bs - 1) // bs  # (b,)
        return mask, self.batch_layout(num_blocks, nb)

    def reference(self, query, key, value, inputs: AttentionInputs) -> AttentionOutput:
        """Sparse rows over each query block's key blocks, then the rows of global query blocks replaced by
        dense rows over every real key."""
        return self.block_sparse(query, key, value, inputs, block_sparse_rows, dense_rows, in_place=False)

    def block_sparse(self, query, key, value, inputs, sparse_rows, global_rows, in_place) -> AttentionOutput:
        """The attention computed by ``sparse_rows`` (as :func:`block_sparse_rows`) and ``global_rows`` (as
        :func:`dense_rows`) on this core's layout; ``in_place``: the global rows overwrite the sparse
        output (whose function must keep no reference to it)."""
        b, h, n, d = query.shape
        bs = self.config.block_size
        mask, layout = self.layout_for(inputs.attention_mask, b, n, query.device)
        q, k, v = (pad_to_multiple(t, bs) for t in (query * self.scaling, key, value))  # (b, h, nb * B, d)
        nb = q.shape[2] // bs
        dropout = self.spec.dropout if self.training else 0.0
        index = layout.index  # (b, h, nb, K) key block of each slot
        allowed = layout.valid[..., None].expand(*index.shape, bs)  # (b, h, nb, K, B) keys of the slots
        if mask is not None:
            example = torch.arange(b, device=query.device).view(b, 1, 1, 1) * nb
            allowed = allowed & mask.view(b * nb, bs)[index + example]
        offset = torch.arange(b * h, device=query.device).view(b, h, 1) * nb  # first block of (b, h)
        q_blocks = q.view(b, h, nb, bs, d)  # (b, h, nb, B, d)
        out = sparse_rows(
            q_blocks,
            k.reshape(-1, bs, d),
            v.reshape(-1, bs, d),
            index + offset[..., None],  # flat ids into the (b * h * nb) blocks
            ~allowed.reshape(b, h, nb, -1),  # (b, h, nb, K * B) keys excluded
            layout.global_ids[:, None, :] + offset,  # (b, h, G) flat ids of the global slots
            self.config.num_window_blocks,
            dropout,
        )  # (b, h, nb, B, d)
        count = layout.global_ids.shape[1]
        if count:  # the global query blocks' rows: dense, over every real key
            gather = layout.global_ids[:, None, :, None, None].expand(b, h, count, bs, d)
            q_global = q_blocks.gather(2, gather).reshape(b * h, count * bs, d)  # (b h, G B, d)
            key_mask = None if mask is None else mask[:, None, None].expand(b, h, 1, -1).reshape(b * h, 1, -1)
            dense = global_rows(q_global, k.reshape(b * h, -1, d), v.reshape(b * h, -1, d), key_mask, dropout)
            unused = ~layout.global_used[:, None, :, None, None]  # duplicate slots add nothing
            dense = dense.view(b, h, count, bs, d).masked_fill(unused, 0.0)
            fill = layout.is_global[:, None, :, None, None]  # (b, 1, nb, 1, 1)
            if in_place:
                out = out.masked_fill_(fill, 0.0).scatter_add_(2, gather, dense)
            else:
                out = out.masked_fill(fill, 0.0).scatter_add(2, gather, dense)
        return AttentionOutput(unpad(out.view(b, h, nb * bs, d), n), None)
