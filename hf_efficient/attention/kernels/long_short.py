"""Transformer-LS's kernel ("chunked"): the segment-wise softmax as a flash-style autograd Function.

It computes :meth:`~hf_efficient.attention.long_short.LongShortAttention.reference` with the core's own
parameters and LayerNorm (``core.layer_norm``), and differs from it in how, not what:

* (batch, head) rows and, inside :class:`_SegmentAttention`, segments are taken a chunk at a time, so that
  every intermediate stays within ``CHUNK_BYTES`` (a module attribute, so tests can make several chunks
  of small inputs);
* the windowed softmax is one autograd Function that gathers each segment's keys with a single copy,
  saves only the probabilities (and dropout masks), and in backward gathers again and scatters the keys'
  gradients back with two adds (FlashAttention-style);
* without padding, on a CPU only the first and last segments' margins are masked (:func:`_mask_invalid_`).

``"auto"`` takes it for every call that is not traced (it does not run inside torch.export /
torch.compile graphs; the reference does).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

from ..base import AttentionOutput, Kernel
from ..utils import CHUNK_BYTES, device_chunk_budget, host_reads_are_cheap, rows_per_chunk


def chunked_long_short(core, query, key, value, inputs) -> AttentionOutput:
    """The core's long-short attention, a chunk of rows and segments at a time (see the module docstring)."""
    attention_mask = inputs.attention_mask
    b, h, n, d = query.shape
    w, r = core.config.window_size, core.config.num_landmarks
    e = w // 2
    num_segments = -(-n // w)
    n_pad = num_segments * w
    window = w + 2 * e  # local keys per segment
    total_keys = window + r  # keys per query: window then landmarks
    device = query.device

    # Which local keys are real: (b, n_pad + 2e) with the e-wide margins and the padding False.
    real = torch.ones(b, n, dtype=torch.bool, device=device) if attention_mask is None else attention_mask
    key_valid = F.pad(real, (e, e + n_pad - n), value=False)
    key_valid = key_valid.unfold(1, window, w)  # (b, S, window)
    key_valid = F.pad(key_valid, (0, r), value=True)  # (b, S, window + r); landmarks always valid
    per_row = {"key_valid": key_valid[:, None].expand(b, h, num_segments, total_keys)}
    if attention_mask is not None:
        per_row["real"] = real[:, None].expand(b, h, n)  # (b, h, n)
    # in the inputs' dtype: float32 parameters meet half-precision inputs under autocast
    params = {name: p.to(query.dtype) for name, p in core.named_parameters(recurse=False)}
    per_row.update({name: p[None].expand(b, *p.shape) for name, p in params.items()})  # (b, h, ...)

    # Rows per chunk: the (segments, w, window + r) scores of a row dominate every other intermediate.
    bytes_per_segment = query.element_size() * total_keys * max(w, d)
    budget = device_chunk_budget(CHUNK_BYTES, device)  # larger chunks on CUDA: fewer launches
    segments_per_chunk = rows_per_chunk(bytes_per_segment, num_segments, budget)
    rows = rows_per_chunk(bytes_per_segment * num_segments, b * h, budget)
    chunks = zip(*(_row_chunks(t, rows) for t in (query, key, value, *per_row.values())), strict=True)

    dropout = core.spec.dropout if core.training else 0.0
    settings = (core.scaling, segments_per_chunk, dropout)
    outputs = []
    for q, k, v, *row_values in chunks:
        row = dict(zip(per_row, row_values, strict=True))
        if "real" in row:  # zero padded tokens so that poisoned (even inf) padding cannot leak
            pad = ~row["real"][:, :, None]  # (rows, n, 1)
            q, k, v = q.masked_fill(pad, 0.0), k.masked_fill(pad, 0.0), v.masked_fill(pad, 0.0)
        if r > 0:
            landmark_keys, landmark_values = _landmarks(core, k, v, row)  # (rows, r, d) each
        else:
            landmark_keys = landmark_values = k.new_zeros(k.shape[0], 0, d)  # (rows, 0, d)
        # Queries in segments; keys/values shifted right by e and cut into S + 1 blocks (see _gather).
        q = (F.pad(q, (0, 0, 0, n_pad - n)) if n_pad > n else q).reshape(-1, num_segments, w, d)
        shift = (0, 0, e, n_pad + w - e - n)  # e zeros first, zeros after up to (S + 1) w rows
        k = F.pad(_layer_norm(core, k, "local", row), shift).view(-1, num_segments + 1, w, d)
        v = F.pad(_layer_norm(core, v, "local", row), shift).view(-1, num_segments + 1, w, d)
        out = _SegmentAttention.apply(q, k, v, landmark_keys, landmark_values, row["key_valid"], *settings)
        outputs.append(out)  # (rows, S, w, d)
    out = torch.cat(outputs, dim=0) if len(outputs) > 1 else outputs[0]  # (b * h, S, w, d)
    out = out.view(b, h, n_pad, d)[:, :, :n]  # (b, h, n, d)
    return AttentionOutput(out, None)


CHUNKED = Kernel("chunked", chunked_long_short)


def _layer_norm(core, x: torch.Tensor, which: str, weight_rows: dict) -> torch.Tensor:
    """LayerNorm over head_dim with per-head affine; x is (rows, ..., d), weights (rows, d)."""
    if not core.config.dual_ln:
        return x
    weight, bias = weight_rows[f"{which}_norm_weight"], weight_rows[f"{which}_norm_bias"]
    shape = (x.shape[0],) + (1,) * (x.dim() - 2) + (x.shape[-1],)
    return core.layer_norm(x, weight.view(shape), bias.view(shape))


def _landmarks(core, k: torch.Tensor, v: torch.Tensor, row: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """K_bar = LN_G(P^T K), V_bar = LN_G(P^T V), P = softmax over positions of K W^P.

    Args:
        k, v: (rows, n, d), padded positions already zero.
        row: per-row tensors of the chunk (``dynamic_projection`` (rows, d, r), ``real`` (rows, n)).
    Returns:
        two (rows, r, d) tensors.
    """
    # Logits laid out (rows, r, n) so that the softmax over positions runs along the last dim.
    logits = torch.bmm(row["dynamic_projection"].transpose(1, 2), k.transpose(1, 2))  # (rows, r, n)
    if "real" in row:
        logits = logits.masked_fill(~row["real"][:, None, :], float("-inf"))
    projection = torch.softmax(logits, dim=-1)  # P^T: (rows, r, n)
    landmark_keys = _layer_norm(core, torch.bmm(projection, k), "global", row)  # (rows, r, d)
    landmark_values = _layer_norm(core, torch.bmm(projection, v), "global", row)  # (rows, r, d)
    return landmark_keys, landmark_values


def _row_chunks(x: torch.Tensor, rows: int) -> list[torch.Tensor]:
    """Cut a (b, h, ...) tensor into chunks of at most ``rows`` flattened (batch, head) rows, in order.

    Uses split/unbind (whose backward is one concatenation), never slicing, so chunking stays O(n) in
    backward. A chunk holds whole batch items when ``rows >= h``, else part of one item's heads.
    Returns tensors of shape (rows_c, ...).
    """
    h = x.shape[1]
    if rows >= h:
        return [c.reshape(-1, *c.shape[2:]) for c in x.split(rows // h, dim=0)]  # (items * h, ...)
    return [c for item in x.unbind(0) for c in item.split(rows, dim=0)]  # (heads_c, ...)


def _gather(blocks: torch.Tensor, landmarks: torch.Tensor, s0: int, s1: int, margin: int) -> torch.Tensor:
    """Keys (or values) of segments [s0, s1): the window w + 2e, then the r landmarks; one copy.

    Args:
        blocks: (rows, S + 1, w, d) local keys shifted right by e (e zeros first), cut into blocks of w,
            so that segment s's window is block s followed by the first 2e rows of block s + 1.
        landmarks: (rows, r, d).
        margin: 2e.
    Returns:
        (rows, s1 - s0, w + 2e + r, d).
    """
    shape = (blocks.shape[0], s1 - s0, *landmarks.shape[1:])
    parts = [blocks[:, s0:s1], blocks[:, s0 + 1 : s1 + 1, :margin], landmarks[:, None].expand(shape)]
    return torch.cat(parts, dim=2)


def _scatter_add(
    grad_blocks: torch.Tensor, grad_landmarks: torch.Tensor, grad: torch.Tensor, s0: int, margin: int
) -> None:
    """Adjoint of :func:`_gather`: add grad (rows, S_c, w + 2e + r, d) back into its sources, in place."""
    w, s1 = grad_blocks.shape[2], s0 + grad.shape[1]
    grad_blocks[:, s0:s1] += grad[:, :, :w]
    grad_blocks[:, s0 + 1 : s1 + 1, :margin] += grad[:, :, w : w + margin]
    grad_landmarks += grad[:, :, w + margin :].sum(1)


def _mask_invalid_(scores: torch.Tensor, key_valid: torch.Tensor) -> None:
    """Fill scores (rows, S_c, w, L) of invalid keys (key_valid (rows, S_c, L) False) with dtype's min.

    Without padding only the first and last segments hold invalid keys (their margins): on a CPU fill just
    those; on an accelerator finding them would be a host read (a sync), so every segment is filled.
    """
    lowest = torch.finfo(scores.dtype).min
    if not host_reads_are_cheap(scores):
        scores.masked_fill_(~key_valid[:, :, None, :], lowest)
        return
    segments = (~key_valid.all(-1).all(0)).nonzero().flatten().tolist()
    if len(segments) > scores.shape[1] // 4:
        scores.masked_fill_(~key_valid[:, :, None, :], lowest)
        return
    for s in segments:
        scores[:, s].masked_fill_(~key_valid[:, s, None, :], lowest)


class _SegmentAttention(torch.autograd.Function):
    """softmax over [segment window ; landmarks] per query, chunked over segments, flash-style backward.

    Saves the probabilities (and dropout masks) only; the gathered keys/values are rebuilt in backward.
    Inputs: q (rows, S, w, d); k, v (rows, S + 1, w, d) local keys/values shifted right by e (see
    :func:`_gather`); k_bar, v_bar (rows, r, d); key_valid (rows, S, L) bool. Output (rows, S, w, d).
    """

    @staticmethod
    def forward(ctx, q, k, v, k_bar, v_bar, key_valid, scale: float, per_piece: int, dropout: float):
        num_segments, margin = q.shape[1], key_valid.shape[2] - k_bar.shape[1] - q.shape[2]
        saved, pieces = [], []
        for s0 in range(0, num_segments, per_piece):
            s1 = min(num_segments, s0 + per_piece)
            keys = _gather(k, k_bar, s0, s1, margin)  # (rows, S_c, L, d)
            scores = torch.matmul(q[:, s0:s1] * scale, keys.transpose(-1, -2))  # (rows, S_c, w, L)
            _mask_invalid_(scores, key_valid[:, s0:s1])
            probs = torch.softmax(scores, dim=-1)
            del scores, keys
            saved.append(probs)
            if dropout > 0:
                keep = torch.rand_like(probs) >= dropout
                saved.append(keep)
                probs = probs.masked_fill(~keep, 0.0) / (1.0 - dropout)
            pieces.append(torch.matmul(probs, _gather(v, v_bar, s0, s1, margin)))  # (rows, S_c, w, d)
        out = torch.cat(pieces, dim=1) if len(pieces) > 1 else pieces[0]
        ctx.save_for_backward(q, k, v, k_bar, v_bar, out, *saved)
        ctx.settings = (scale, per_piece, dropout, margin)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out):
        q, k, v, k_bar, v_bar, out, *saved = ctx.saved_tensors
        scale, per_piece, dropout, margin = ctx.settings
        num_segments = q.shape[1]
        # Softmax backward through D = rowsum(dO * O) = rowsum(dP * P), as in FlashAttention.
        delta = (grad_out * out).sum(-1, keepdim=True)  # (rows, S, w, 1)
        grad_k, grad_v = torch.zeros_like(k), torch.zeros_like(v)
        grad_k_bar, grad_v_bar = torch.zeros_like(k_bar), torch.zeros_like(v_bar)
        saved, grad_q = iter(saved), []
        for s0 in range(0, num_segments, per_piece):
            s1 = min(num_segments, s0 + per_piece)
            probs = dropped = next(saved)  # (rows, S_c, w, L)
            if dropout > 0:
                keep = next(saved)
                dropped = probs.masked_fill(~keep, 0.0) / (1.0 - dropout)
            grad_values = torch.matmul(dropped.transpose(-1, -2), grad_out[:, s0:s1])  # (rows, S_c, L, d)
            _scatter_add(grad_v, grad_v_bar, grad_values, s0, margin)
            values = _gather(v, v_bar, s0, s1, margin)  # (rows, S_c, L, d)
            grad_scores = torch.matmul(grad_out[:, s0:s1], values.transpose(-1, -2))  # (rows, S_c, w, L)
            if dropout > 0:
                grad_scores = grad_scores.masked_fill_(~keep, 0.0).div_(1.0 - dropout)
            grad_scores = grad_scores.sub_(delta[:, s0:s1]).mul_(probs)
            keys = _gather(k, k_bar, s0, s1, margin)  # (rows, S_c, L, d)
            grad_q.append(torch.matmul(grad_scores, keys).mul_(scale))  # (rows, S_c, w, d)
            grad_keys = torch.matmul(grad_scores.transpose(-1, -2), q[:, s0:s1]).mul_(scale)
            _scatter_add(grad_k, grad_k_bar, grad_keys, s0, margin)
        grad_q = torch.cat(grad_q, dim=1) if len(grad_q) > 1 else grad_q[0]
        return grad_q, grad_k, grad_v, grad_k_bar, grad_v_bar, None, None, None, None
