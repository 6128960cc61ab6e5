"""Longformer's kernels: the window chunk group by chunk group ("native"), and FlexAttention ("flex").

Both compute :meth:`~hf_efficient.attention.longformer.LongformerAttention.reference` (see its module for
the maths); the core's global-token helpers (``_global_tokens``, ``_global_slots``, ``_global_rows``) are
shared with it.

``native`` (``"auto"`` everywhere FlexAttention is not taken, unless tracing). Dilation r reshapes
(n, d) -> (n / r, r, d): the tokens of one residue mod r form an undilated sequence, and the r interleaved
subsequences run as one batch. Queries come in chunks of c <= ``MAX_CHUNK`` positions (the longer window
side split into equal blocks); chunk t attends to key blocks t - j .. t + a (j c >= keys before a query,
a c >= keys after it) plus the G global keys, masked to the exact band. Chunks go to the attention kernel
in groups whose keys fit ``GROUP_BYTES``, copied straight from q, k, v into each group's key block, so no
window tensor of the whole sequence is built:

* on CPU without dropout, :class:`_CpuFlashWindow`: torch's fused CPU flash kernel (through
  :mod:`hf_efficient.compat`) per group, saving only q, k, v, the output and the log-sum-exp; backward
  rebuilds each group's windows and accumulates the window gradients block by block into the key
  gradient;
* with dropout or on another device, the same groups through ``scaled_dot_product_attention`` (on CPU with
  dropout :func:`hf_efficient.attention.dropout.sdpa`, its mask drawn fast) and plain autograd.

Global rows (few) are dense over all keys. The window is clipped to the (sub)sequence length, so short
inputs are not padded to a full chunk; an undilated input no longer than a chunk's keys (n <= its span: the
demo's 128 tokens under a 128-token window) runs as one sdpa call with the pattern as an (n x n) mask, fewer
scores than the chunks and none of their copies (a MiniLM training step at 8 x 128 tokens: 1.7 s against
2.1 s on one thread).

``flex`` (``"auto"`` on CUDA, see :data:`~hf_efficient.attention.kernels.flex.FLEX_DEVICES`): the same
pattern as one FlexAttention block mask; masks of unpadded inputs without per-example global tokens depend
on sizes only and are kept per length (``core.flex_masks``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ...compat import HAS_CPU_FLASH, cpu_flash_attention, cpu_flash_attention_backward
from ..base import AttentionOutput, Kernel
from ..dropout import sdpa
from ..utils import CHUNK_BYTES, extend_padding_mask, pad_to_multiple, rows_per_chunk, unpad
from .flex import (
    FLEX_BLOCK,
    FLEX_DEVICES,
    BlockMask,
    blocks_all,
    blocks_holding,
    flex_attend,
    flex_block_mask,
    flex_unsupported,
    num_blocks,
)

MAX_CHUNK = 256  # queries per chunk at most; keys per chunk = chunk + keys before and after (+ globals)
GROUP_BYTES = CHUNK_BYTES  # keys of one group of chunks (one kernel call); tests lower it to reach groups


def chunk_size(before: int, after: int) -> int:
    """Queries per chunk: the longer window side split into the fewest equal blocks of <= MAX_CHUNK."""
    widest = max(before, after, 1)
    return -(-widest // -(-widest // MAX_CHUNK))


# ---- native ------------------------------------------------------------------------------------------
def native_attend(core, query, key, value, inputs) -> AttentionOutput:
    """The window chunk group by chunk group, global rows dense (see the module docstring)."""
    b, h, n, d = query.shape
    device, causal = query.device, inputs.is_causal
    is_global = core._global_tokens(inputs, b, n, device)  # (b, n) or None
    real = inputs.attention_mask
    real = real if real is not None else torch.ones(b, n, dtype=torch.bool, device=device)  # (b, n)
    dropout = core.spec.dropout if core.training else 0.0
    slot_pos, slot_valid = core._global_slots(is_global, inputs, b, n, device)  # (b, G), (b, G)
    r, w = core.config.attention_dilation, core.config.attention_window
    window = _Window.build(w if causal else w // 2, 0 if causal else w // 2, sub_len=-(-n // r))
    if r == 1 and n <= window.span:  # a chunk's keys would number n or more: one dense masked call is less
        out = _dense_band(query, key, value, real, window, slot_pos, slot_valid, dropout, core.scaling)
        if is_global is not None:
            out = core._global_rows(out, query, key, value, real, is_global, slot_pos, slot_valid)
        return AttentionOutput(out, None)
    gather_index = slot_pos[:, None, :, None].expand(b, h, -1, d)  # (b, h, G, d)
    if is_global is None:  # no gather: its backward would allocate a full-size zero gradient
        global_key = global_value = key.new_zeros(b, h, 0, d)
    else:
        global_key, global_value = key.gather(2, gather_index), value.gather(2, gather_index)
    q, k, v = (pad_to_multiple(t, r * window.chunk) for t in (query, key, value))  # (b, h, r m, d)
    key_real = extend_padding_mask(real, b, n, r * window.chunk, device)  # (b, r m)
    m = q.shape[2] // r
    if r > 1:
        # (b, h, m r, d) -> (b, h, m, r, d) -> (b, r, h, m, d) -> (b r, h, m, d): subsequence s holds
        # positions s, s + r, s + 2r, ...
        q, k, v = (t.view(b, h, m, r, d).permute(0, 3, 1, 2, 4).reshape(b * r, h, m, d) for t in (q, k, v))
        key_real = key_real.view(b, m, r).transpose(1, 2).reshape(b * r, m)  # (b r, m)
        global_key, global_value = (t.repeat_interleave(r, dim=0) for t in (global_key, global_value))
    # A global key's position inside subsequence s, or far away when it belongs to another one.
    residue = torch.arange(r, device=device)[None, :, None]  # (1, r, 1)
    in_sub = (slot_pos % r)[:, None, :] == residue  # (b, r, G)
    far = -4 * (m + window.reach + window.reach_after)
    sub_pos = torch.where(in_sub, (slot_pos // r)[:, None, :], far)  # (b, r, G)
    mask = window.mask(key_real, sub_pos.flatten(0, 1), slot_valid.repeat_interleave(r, dim=0))
    if device.type == "cpu" and dropout == 0.0 and HAS_CPU_FLASH:
        chunks = _CpuFlashWindow.apply(q, k, v, global_key, global_value, mask, window, core.scaling)
    else:  # dropout or another device: the same groups through sdpa and plain autograd
        groups = window.groups(q, global_key.shape[2])
        chunks = torch.cat(
            [
                sdpa(
                    *window.group(q, k, v, global_key, global_value, start, stop),
                    attn_mask=mask[start:stop].flatten(0, 1)[:, None],
                    dropout_p=dropout,
                    scale=core.scaling,
                )
                for start, stop in groups
            ]
        )
    # (num_chunks B, h, chunk, d) -> (num_chunks, b, r, h, chunk, d) -> (b, h, num_chunks, chunk, r, d)
    # -> (b, h, r m, d): position (t chunk + a) r + s
    chunks = chunks.view(-1, b, r, h, window.chunk, d).permute(1, 3, 0, 4, 2, 5)
    out = unpad(chunks.reshape(b, h, m * r, d), n)  # (b, h, n, d)
    if is_global is not None:
        out = core._global_rows(out, query, key, value, real, is_global, slot_pos, slot_valid)
    return AttentionOutput(out, None)


def _dense_band(query, key, value, real, window, slot_pos, slot_valid, dropout, scaling) -> torch.Tensor:
    """Short inputs (n <= a chunk's keys): the same pattern as one (b, 1, n, n) mask in one sdpa call, fewer
    scores than the chunks' (each chunk would hold at least n keys) and none of their copies. Query i sees key
    j where -before <= j - i <= after and j is real (or j = i, so no padded row is empty), and every real
    global key; the global rows are replaced afterwards, as on the chunked path."""
    b, h, n, d = query.shape
    device = query.device
    offset = torch.arange(n, device=device)[None, :] - torch.arange(n, device=device)[:, None]  # j - i
    band = (offset >= -window.before) & (offset <= window.after)  # (n, n)
    allowed = band & (real[:, None, :] | (offset == 0))  # (b, n, n)
    if slot_pos.shape[1]:  # the global keys' columns
        # summed, not scattered: an unused slot may share a position with a used one
        columns = torch.zeros(b, n, dtype=torch.int32, device=device).scatter_add(
            1, slot_pos, slot_valid.int()
        )
        allowed = allowed | (columns > 0)[:, None, :]
    return sdpa(query, key, value, attn_mask=allowed[:, None], dropout_p=dropout, scale=scaling)


@dataclass(frozen=True)
class _Window:
    """Geometry of undilated window attention computed chunk by chunk.

    Queries come in chunks of ``chunk`` positions; chunk t sees key blocks t - j .. t + a (a block is
    ``chunk`` positions, j chunk >= ``before``, a chunk >= ``after``): ``span`` = (j + 1 + a) chunk keys,
    masked to -before <= k - i <= after (two-sided: before = after = w / 2; causal: before = w, after = 0).
    """

    before: int  # keys seen before the query
    after: int  # keys seen after it
    chunk: int
    blocks: int  # j, key blocks before the query's
    blocks_after: int  # a, key blocks after it

    @classmethod
    def build(cls, before: int, after: int, sub_len: int) -> _Window:
        """The geometry for ``before`` earlier and ``after`` later keys over (sub)sequences of ``sub_len``
        tokens."""
        before, after = min(before, sub_len), min(after, sub_len)  # keys past the ends do not exist
        chunk = chunk_size(before, after)
        return cls(before, after, chunk, -(-before // chunk), -(-after // chunk))

    @property
    def reach(self) -> int:
        """Keys before a chunk's first query that its window blocks hold."""
        return self.blocks * self.chunk

    @property
    def reach_after(self) -> int:
        return self.blocks_after * self.chunk

    @property
    def num_blocks(self) -> int:
        """Key blocks per chunk: j + 1 + a."""
        return self.blocks + 1 + self.blocks_after

    @property
    def span(self) -> int:
        return self.num_blocks * self.chunk

    def mask(
        self, key_real: torch.Tensor, global_pos: torch.Tensor, global_valid: torch.Tensor
    ) -> torch.Tensor:
        """(num_chunks, B, chunk, span + G) bool: which window and global keys each query may see.

        Args:
            key_real: (B, m) bool, False for padded keys.
            global_pos: (B, G) position of each global key in this sequence (far away if not in it): a
                global key inside a query's window is already a local key, so its global column is masked.
            global_valid: (B, G) bool, False for unused slots.
        """
        device, m = key_real.device, key_real.shape[1]
        num_chunks = m // self.chunk
        # Query a of chunk t sits at t chunk + a; window key e at t chunk - reach + e.
        offset = (
            torch.arange(self.span, device=device)
            - self.reach
            - torch.arange(self.chunk, device=device)[:, None]
        )
        band = (offset >= -self.before) & (offset <= self.after)  # (chunk, span)
        # The query itself is always allowed, so padded query rows never have an empty softmax.
        window_real = self.windows(key_real[:, None, :, None])[:, 0, :, :, 0].transpose(
            0, 1
        )  # (chunks, B, span)
        local = band & (window_real[:, :, None, :] | (offset == 0))  # (num_chunks, B, chunk, span)
        query_pos = torch.arange(m, device=device).view(num_chunks, 1, self.chunk, 1)
        relative = global_pos[None, :, None, :] - query_pos  # (num_chunks, B, chunk, G)
        in_window = (relative >= -self.before) & (relative <= self.after)
        return torch.cat([local, global_valid[None, :, None, :] & ~in_window], dim=-1)

    def windows(self, x: torch.Tensor) -> torch.Tensor:
        """(B, h, m, d) -> (B, h, num_chunks, span, d): the window keys of every chunk (zeros past the ends),
        as j + 1 + a shifted views of the blocks."""
        num_chunks = x.shape[2] // self.chunk
        padded = F.pad(x, (0, 0, self.reach, self.reach_after))  # (B, h, m + reaches, d)
        blocks = padded.unflatten(2, (num_chunks + self.num_blocks - 1, self.chunk))
        return torch.cat([blocks[:, :, o : o + num_chunks] for o in range(self.num_blocks)], dim=3)

    def groups(self, q: torch.Tensor, num_global: int) -> list[tuple[int, int]]:
        """Chunk ranges processed per kernel call, so that a group's keys stay under ``GROUP_BYTES``."""
        batch, h, m, d = q.shape
        num_chunks = m // self.chunk
        size = rows_per_chunk(
            batch * h * (self.span + num_global) * d * q.element_size(), num_chunks, GROUP_BYTES
        )
        return [(start, min(start + size, num_chunks)) for start in range(0, num_chunks, size)]

    def group(self, q, k, v, global_key, global_value, start: int, stop: int) -> tuple[torch.Tensor, ...]:
        """Queries (size B, h, chunk, d) and keys, values (size B, h, span + G, d) of chunks start:stop."""
        batch, h, m, d = q.shape
        size, c, j, a = stop - start, self.chunk, self.blocks, self.blocks_after
        # (B, h, m, d) -> (B, h, num_chunks, chunk, d) -> (size, B, h, chunk, d) -> (size B, h, chunk, d)
        queries = q.view(batch, h, m // c, c, d)[:, :, start:stop].permute(2, 0, 1, 3, 4).reshape(-1, h, c, d)
        lo, hi = (start - j) * c, (stop + a) * c
        out = [queries]
        for x, extra in ((k, global_key), (v, global_value)):
            piece = x[:, :, max(lo, 0) : min(hi, m)]  # a view, padded (copied) only at the ends
            if lo < 0 or hi > m:
                piece = F.pad(piece, (0, 0, max(0, -lo), max(0, hi - m)))
            # (B, h, (size + j + a) c, d) -> (B, h, size + j + a, c, d)
            # -> unfold (B, h, size, c, d, j + 1 + a) -> (size, B, h, j + 1 + a, c, d)
            # -> (size, B, h, span, d)
            blocks = piece.view(batch, h, size + j + a, c, d).unfold(2, self.num_blocks, 1)
            blocks = blocks.permute(2, 0, 1, 5, 3, 4)  # (size, B, h, j + 1 + a, c, d)
            # One copy straight into the group's keys: (size, B, h, span + G, d), globals last.
            keys = x.new_empty(size, batch, h, self.span + extra.shape[2], d)
            keys[:, :, :, : self.span].unflatten(3, (self.num_blocks, c)).copy_(blocks)
            keys[:, :, :, self.span :].copy_(extra[None].expand(size, -1, -1, -1, -1))
            out.append(keys.flatten(0, 1))  # (size B, h, span + G, d)
        return tuple(out)


def _additive(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """(chunks, B, chunk, keys) bool -> (chunks B, 1, chunk, keys) additive mask (0 / -inf)."""
    return (
        torch.zeros(mask.shape, dtype=dtype, device=mask.device)
        .masked_fill_(~mask, float("-inf"))
        .flatten(0, 1)[:, None]
    )


class _CpuFlashWindow(torch.autograd.Function):
    """Window attention through torch's fused CPU flash kernel, recomputing the windows in backward.

    Saves only q, k, v, the output and the log-sum-exp (O(n d)); window gradients are accumulated block by
    block into the key gradient, so no intermediate is larger than one group's keys.
    """

    @staticmethod
    def forward(ctx, q, k, v, global_key, global_value, mask, window: _Window, scale: float):
        outputs, lses = [], []
        for start, stop in window.groups(q, global_key.shape[2]):
            inputs = window.group(q, k, v, global_key, global_value, start, stop)
            out, lse = cpu_flash_attention(*inputs, _additive(mask[start:stop], q.dtype), scale)
            outputs.append(out)
            lses.append(lse)
        out = torch.cat(outputs)  # (num_chunks B, h, chunk, d)
        ctx.save_for_backward(q, k, v, global_key, global_value, mask, out, torch.cat(lses))
        ctx.window, ctx.scale = window, scale
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, global_key, global_value, mask, out, lse = ctx.saved_tensors
        window, (batch, h, m, d) = ctx.window, q.shape
        c, j, span = window.chunk, window.blocks, window.span
        grad_out = grad_out.contiguous()
        grad_q = torch.empty_like(q)
        grad_kv = [torch.zeros_like(k), torch.zeros_like(v)]
        grad_global = [torch.zeros_like(global_key), torch.zeros_like(global_value)]
        for start, stop in window.groups(q, global_key.shape[2]):
            rows = slice(start * batch, stop * batch)
            grads = cpu_flash_attention_backward(
                grad_out[rows],
                *window.group(q, k, v, global_key, global_value, start, stop),
                out[rows],
                lse[rows],
                _additive(mask[start:stop], q.dtype),
                ctx.scale,
            )
            # (size B, h, chunk, d) -> (size, B, h, chunk, d) -> (B, h, size, chunk, d)
            dq = grads[0].view(-1, batch, h, c, d).permute(1, 2, 0, 3, 4)
            grad_q.view(batch, h, m // c, c, d)[:, :, start:stop] = dq
            for grad, total, glob in zip(grads[1:], grad_kv, grad_global, strict=True):
                grad = grad.view(-1, batch, h, span + glob.shape[2], d)  # (size, B, h, span + G, d)
                local = grad[:, :, :, :span].unflatten(3, (window.num_blocks, c))  # (size, B, h, j+1+a, c, d)
                blocks = total.view(batch, h, m // c, c, d)  # (B, h, num_chunks, c, d)
                for o in range(window.num_blocks):  # window block o of chunk t is key block t + o - j
                    lo, hi = max(start + o - j, 0), min(stop + o - j, m // c)
                    shift = start + o - j
                    blocks[:, :, lo:hi] += local[lo - shift : hi - shift, :, :, o].permute(1, 2, 0, 3, 4)
                glob += grad[:, :, :, span:].sum(0)
        return grad_q, *grad_kv, *grad_global, None, None, None


# ---- flex --------------------------------------------------------------------------------------------
def flex_attend_window(core, query, key, value, inputs) -> AttentionOutput:
    """The window and global tokens as one FlexAttention block mask (:func:`flex_mask`)."""
    b, h, n, d = query.shape
    attention_mask, global_attention_mask = inputs.attention_mask, inputs.global_attention_mask
    device, causal = query.device, inputs.is_causal
    is_global = core._global_tokens(inputs, b, n, device)
    # a pattern of sizes only (no padding, no per-example global tokens): one mask per length
    same_for_all = attention_mask is None and global_attention_mask is None
    cache_key = (n, str(device), causal) if same_for_all else None
    if same_for_all and is_global is not None:
        is_global = is_global[:1]  # from global_token_indices: the same in every example
    mask = core.flex_masks.get(
        cache_key, lambda: flex_mask(core.config, n, attention_mask, is_global, device, causal)
    )
    return AttentionOutput(flex_attend(query, key, value, mask, core.scaling), None)


def flex_mask(config, n, real, is_global, device, causal: bool = False) -> BlockMask:
    """The window pattern of ``config`` as one FlexAttention block mask (batch: that of real / is_global).

    Token level: key k is real and (|q - k| <= r w/2 with r | q - k, or q or k is global); causal:
    0 <= q - k <= r w with r | q - k. Block level, from sizes: blocks I, J hold a window pair when their
    closest tokens are within reach; every pair when their farthest are (undilated, keys all real);
    global tokens open their block's row and column.
    """
    b = max([1] + [t.shape[0] for t in (real, is_global) if t is not None])
    half, r = config.attention_window // 2, config.attention_dilation
    reach = (2 * half if causal else half) * r

    shared_global = is_global[0] if is_global is not None and is_global.shape[0] == 1 else None

    def mask_mod(batch, head, q, k):
        distance = q - k
        within = (distance >= 0) & (distance <= reach) if causal else distance.abs() <= reach
        allowed = within & (distance % r == 0)
        if shared_global is not None:  # the same global tokens in every example (B = 1 mask)
            allowed = allowed | shared_global[q] | shared_global[k]
        elif is_global is not None:
            allowed = allowed | is_global[batch, q] | is_global[batch, k]
        return allowed & real[batch, k] if real is not None else allowed

    nb = num_blocks(n)
    blocks = torch.arange(nb, device=device)
    apart = (blocks[:, None] - blocks[None, :]).abs()  # (nb, nb) block distance
    closest = (apart - 1).clamp(min=0) * FLEX_BLOCK + (apart > 0).long()  # nearest token pair's distance
    partial = (closest <= reach)[None, None]  # (1, 1, nb, nb)
    full = ((apart + 1) * FLEX_BLOCK - 1 <= reach)[None, None] if r == 1 else torch.zeros_like(partial)
    if causal:  # key blocks at or before the query block; the diagonal block is never full
        earlier = (blocks[:, None] >= blocks[None, :])[None, None]
        partial, full = partial & earlier, full & (blocks[:, None] > blocks[None, :])[None, None]
    if is_global is not None:
        holds = blocks_holding(is_global)  # (b, nb)
        partial = partial | holds[:, None, :, None] | holds[:, None, None, :]
    if real is not None:
        partial = partial & blocks_holding(real)[:, None, None, :]
        full = full & blocks_all(real)[:, None, None, :]
    partial, full = partial.expand(b, 1, nb, nb), full.expand(b, 1, nb, nb)
    return flex_block_mask(partial, mask_mod, n, full=full & partial)


def native_unsupported(core, query, inputs) -> str | None:
    """Relative position scores are added by the reference only (no kernel forms them)."""
    if inputs is not None and inputs.relative_positions is not None:
        return "it adds no relative position scores (the reference does)"
    return None


def flex_window_unsupported(core, query, inputs) -> str | None:
    return native_unsupported(core, query, inputs) or flex_unsupported(core, query, inputs)


# In the order "auto" tries them: FlexAttention on CUDA (FLEX_DEVICES), else the chunked window
# (not while tracing: there the reference runs, as one graph without a loop over chunk groups).
FLEX = Kernel("flex", flex_attend_window, flex_window_unsupported, traces=True, devices=FLEX_DEVICES)
NATIVE = Kernel("native", native_attend, native_unsupported)
LONGFORMER_KERNELS = (FLEX, NATIVE)

__all__ = [
    "FLEX",
    "LONGFORMER_KERNELS",
    "MAX_CHUNK",
    "NATIVE",
    "chunk_size",
    "flex_attend_window",
    "flex_mask",
    "native_attend",
]
