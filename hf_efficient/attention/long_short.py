"""Transformer-LS: long-short attention, bidirectional form.

Zhu et al. 2021, "Long-Short Transformer: Efficient Transformers for Language and Vision" (NeurIPS),
https://arxiv.org/abs/2107.02192; reference code https://github.com/NVIDIA/transformer-ls.

Per head, with w = ``window_size``, e = floor(w / 2) and r = ``num_landmarks``:

    short-term: the sequence is cut into segments of w tokens; a query of segment s attends to the keys
                at positions [s w - e, s w + w + e)  (its segment plus e tokens on each side)
    long-range: P = softmax_n(K W^P)  (n x r, softmax over positions, padded positions -> -inf)
                K_bar = P^T K,  V_bar = P^T V  (r x d)
    DualLN:     a_i = softmax([q_i LN_L(K_win(i))^T , q_i LN_G(K_bar)^T] / sqrt(d))
                out_i = a_i [LN_L(V_win(i)) ; LN_G(V_bar)]

one softmax per query over its w + 2e window keys and the r global keys. Cost O(n (w + 2e + r) d) time
and O(n (w + 2e + r)) memory (the probabilities kept for backward); nothing of size n x n is ever built.
Work is done in chunks of (batch x head) rows and segments so that every intermediate stays under
``utils.CHUNK_BYTES``; the windowed softmax is one autograd Function that gathers each segment's keys
with a single copy and scatters their gradients back with two adds (FlashAttention-style backward).

Deviations from the paper / official code:
- W^P acts on each head's projected keys, (d, r) per head, instead of on the layer input X (official:
  one Linear(hidden, heads * r) on X). This contract sees only projected heads; the paper's equation is
  written P = softmax(K W^P), so the difference is only in what "K" means. W^P has no bias: a bias per
  landmark would shift a whole softmax column and cancel.
- The LayerNorms normalise over head_dim per head (official: over the full hidden size), with affine
  parameters per (head, dim), so the parameter count matches the official LayerNorm(hidden).
- K_bar = P^T K uses the raw keys as in the paper's equation (the official code projects the LN_L-normed
  keys). ``num_landmarks = 0`` drops the long-range branch (pure segment-wise sliding window);
  ``dual_ln = False`` drops both LayerNorms. Both switches exist in the official code too.
- The CLS-token special case and the depth-wise convolution of the official LRA code are left out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.autograd.function import once_differentiable

from .base import AttentionCapabilities, AttentionCore, AttentionOutput, AttentionSpec
from .config import AttentionConfig
from .inputs import AttentionInputs, is_tracing
from .registry import register_attention
from .utils import CHUNK_BYTES, pad_to_multiple, rows_per_chunk, unpad


@dataclass
class LongShortConfig(AttentionConfig):
    """Hyperparameters of Transformer-LS.

    Attributes:
        window_size: segment length w; each query also sees floor(w / 2) keys on either side.
        num_landmarks: rank r of the dynamic projection (global keys per head); 0 disables the branch.
        dual_ln: apply the separate LayerNorms to local and to projected keys/values (DualLN).
        layer_norm_eps: epsilon of both LayerNorms.
    """

    window_size: int = 128
    num_landmarks: int = 64
    dual_ln: bool = True
    layer_norm_eps: float = 1e-5

    def validate(self) -> None:
        if self.window_size < 1:
            raise ValueError(f"window_size must be >= 1, got {self.window_size}.")
        if self.num_landmarks < 0:
            raise ValueError(
                f"num_landmarks must be >= 0 (0 disables the long branch), got {self.num_landmarks}."
            )
        if not self.layer_norm_eps > 0:
            raise ValueError(f"layer_norm_eps must be > 0, got {self.layer_norm_eps}.")


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

    Without padding only the first and last segments hold invalid keys (their margins): fill just those.
    """
    lowest = torch.finfo(scores.dtype).min
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


@register_attention("long_short")
class LongShortAttention(AttentionCore):
    config_class = LongShortConfig
    capabilities = AttentionCapabilities(modalities=frozenset({"text", "vision", "graph"}))
    paper = "Zhu et al. 2021, Long-Short Transformer: Efficient Transformers for Language and Vision"
    cost = "O(n·(w+r))"
    summary = "segment-wise window + dynamic low-rank projection, dual LayerNorm"
    small_config = {"window_size": 6, "num_landmarks": 4}

    @classmethod
    def forward_flops(cls, n, head_dim, config, num_edges=None):
        """4 n min(n, w + 2e) d + 6 n r d + 4 n r d: window w + 2 floor(w/2) keys, P = softmax(K W), P^T K,
        P^T V, and r landmark keys."""
        w, r = config.window_size, config.num_landmarks
        window_keys = min(n, w + 2 * (w // 2))
        return 4.0 * n * window_keys * head_dim + 10.0 * n * r * head_dim

    no_weight_decay = ("local_norm_weight", "global_norm_weight")  # LayerNorm gains, as nn.LayerNorm's

    def __init__(self, spec: AttentionSpec, config: LongShortConfig | None = None):
        super().__init__(spec, config)
        h, d, r = spec.num_heads, spec.head_dim, self.config.num_landmarks
        self.dynamic_projection = nn.Parameter(torch.empty(h, d, r)) if r > 0 else None  # W^P per head
        if self.config.dual_ln:
            self.local_norm_weight = nn.Parameter(torch.empty(h, d))
            self.local_norm_bias = nn.Parameter(torch.empty(h, d))
            self.global_norm_weight = nn.Parameter(torch.empty(h, d))
            self.global_norm_bias = nn.Parameter(torch.empty(h, d))
        self.init_weights()

    def init_weights(self) -> None:
        """W^P ~ U(-1/sqrt(d), 1/sqrt(d)) (nn.Linear's default, as the official dconv_fc); LN = identity."""
        if self.dynamic_projection is not None:
            bound = 1.0 / math.sqrt(self.head_dim)
            nn.init.uniform_(self.dynamic_projection, -bound, bound)
        if self.config.dual_ln:
            for name in ("local", "global"):
                nn.init.ones_(getattr(self, f"{name}_norm_weight"))
                nn.init.zeros_(getattr(self, f"{name}_norm_bias"))

    def _layer_norm(self, x: torch.Tensor, which: str, weight_rows: dict) -> torch.Tensor:
        """LayerNorm over head_dim with per-head affine; x is (rows, ..., d), weights (rows, d)."""
        if not self.config.dual_ln:
            return x
        weight, bias = weight_rows[f"{which}_norm_weight"], weight_rows[f"{which}_norm_bias"]
        shape = (x.shape[0],) + (1,) * (x.dim() - 2) + (x.shape[-1],)
        return self._affine_norm(x, weight.view(shape), bias.view(shape))

    def _affine_norm(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        """LayerNorm of x over its last dim (head_dim), then weight and bias (broadcast against x)."""
        normed = F.layer_norm(x, x.shape[-1:], eps=self.config.layer_norm_eps)
        return torch.addcmul(bias, normed, weight)

    def _attend(self, query, key, value, inputs: AttentionInputs) -> AttentionOutput:
        attention_mask = inputs.attention_mask
        if is_tracing():
            return AttentionOutput(self._attend_whole(query, key, value, attention_mask), None)
        b, h, n, d = query.shape
        w, r = self.config.window_size, self.config.num_landmarks
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
        params = {name: p.to(query.dtype) for name, p in self.named_parameters(recurse=False)}
        per_row.update({name: p[None].expand(b, *p.shape) for name, p in params.items()})  # (b, h, ...)

        # Rows per chunk: the (segments, w, window + r) scores of a row dominate every other intermediate.
        bytes_per_segment = query.element_size() * total_keys * max(w, d)
        segments_per_chunk = rows_per_chunk(bytes_per_segment, num_segments, CHUNK_BYTES)
        rows = rows_per_chunk(bytes_per_segment * num_segments, b * h, CHUNK_BYTES)
        chunks = zip(*(_row_chunks(t, rows) for t in (query, key, value, *per_row.values())), strict=True)

        dropout = self.spec.dropout if self.training else 0.0
        settings = (self.scaling, segments_per_chunk, dropout)
        outputs = []
        for q, k, v, *row_values in chunks:
            row = dict(zip(per_row, row_values, strict=True))
            if "real" in row:  # zero padded tokens so that poisoned (even inf) padding cannot leak
                pad = ~row["real"][:, :, None]  # (rows, n, 1)
                q, k, v = q.masked_fill(pad, 0.0), k.masked_fill(pad, 0.0), v.masked_fill(pad, 0.0)
            if r > 0:
                landmark_keys, landmark_values = self._landmarks(k, v, row)  # (rows, r, d) each
            else:
                landmark_keys = landmark_values = k.new_zeros(k.shape[0], 0, d)  # (rows, 0, d)
            # Queries in segments; keys/values shifted right by e and cut into S + 1 blocks (see _gather).
            q = (F.pad(q, (0, 0, 0, n_pad - n)) if n_pad > n else q).reshape(-1, num_segments, w, d)
            shift = (0, 0, e, n_pad + w - e - n)  # e zeros first, zeros after up to (S + 1) w rows
            k = F.pad(self._layer_norm(k, "local", row), shift).view(-1, num_segments + 1, w, d)
            v = F.pad(self._layer_norm(v, "local", row), shift).view(-1, num_segments + 1, w, d)
            out = _SegmentAttention.apply(
                q, k, v, landmark_keys, landmark_values, row["key_valid"], *settings
            )
            outputs.append(out)  # (rows, S, w, d)
        out = torch.cat(outputs, dim=0) if len(outputs) > 1 else outputs[0]  # (b * h, S, w, d)
        out = out.view(b, h, n_pad, d)[:, :, :n]  # (b, h, n, d)
        return AttentionOutput(out, None)

    def _attend_whole(self, query, key, value, attention_mask) -> torch.Tensor:
        """The same attention in one piece on (b, h, n, d) tensors, with plain autograd: what torch.export and
        torch.compile trace (no loop over chunks, no custom Function; memory O(n (w + 2e + r)) per head)."""
        b, h, n, d = query.shape
        w, r = self.config.window_size, self.config.num_landmarks
        e = w // 2
        real = (
            torch.ones(b, n, dtype=torch.bool, device=query.device)
            if attention_mask is None
            else attention_mask
        )
        pad = ~real[:, None, :, None]  # (b, 1, n, 1)
        q, k, v = (t.masked_fill(pad, 0.0) for t in (query, key, value))  # poisoned padding cannot leak
        params = {name: p.to(query.dtype) for name, p in self.named_parameters(recurse=False)}

        def norm(x, which):  # LN over head_dim with per-head affine, (b, h, ..., d)
            if not self.config.dual_ln:
                return x
            weight, bias = params[f"{which}_norm_weight"], params[f"{which}_norm_bias"]  # (h, d)
            shape = (1, h) + (1,) * (x.dim() - 3) + (d,)
            return self._affine_norm(x, weight.view(shape), bias.view(shape))

        def windows(x):  # (b, ..., n) -> (b, ..., S, w + 2e): segment s sees [s w - e, s w + w + e)
            padded = F.pad(pad_to_multiple(x, w, dim=-1), (e, w - e))  # e before, up to (S + 1) w
            blocks = padded.unflatten(-1, (-1, w))  # (b, ..., S + 1, w)
            return torch.cat([blocks[..., :-1, :], blocks[..., 1:, : 2 * e]], dim=-1)

        def token_windows(x):  # (b, h, n, d) -> (b, h, S, w + 2e, d)
            return windows(x.transpose(2, 3)).permute(0, 1, 3, 4, 2)

        keys, values = token_windows(norm(k, "local")), token_windows(norm(v, "local"))
        valid = windows(real)  # (b, S, w + 2e)
        num_segments = valid.shape[1]
        if r > 0:
            logits = params["dynamic_projection"].transpose(1, 2) @ k.transpose(2, 3)  # (b, h, r, n)
            projection = torch.softmax(logits.masked_fill(~real[:, None, None], float("-inf")), dim=-1)
            landmark_keys = norm(projection @ k, "global")[:, :, None]  # (b, h, 1, r, d)
            landmark_values = norm(projection @ v, "global")[:, :, None]
            shape = (b, h, num_segments, r, d)
            keys = torch.cat([keys, landmark_keys.expand(shape)], dim=3)  # (b, h, S, w + 2e + r, d)
            values = torch.cat([values, landmark_values.expand(shape)], dim=3)
            valid = F.pad(valid, (0, r), value=True)  # landmarks always valid
        q = pad_to_multiple(q * self.scaling, w).view(b, h, num_segments, w, d)  # (b, h, S, w, d)
        scores = q @ keys.transpose(-1, -2)  # (b, h, S, w, w + 2e + r)
        scores = scores.masked_fill(~valid[:, None, :, None, :], torch.finfo(scores.dtype).min)
        probs = torch.softmax(scores, dim=-1)
        if self.training and self.spec.dropout > 0:
            probs = F.dropout(probs, self.spec.dropout)
        return unpad((probs @ values).view(b, h, num_segments * w, d), n)  # (b, h, S w, d) -> (b, h, n, d)

    def _landmarks(self, k: torch.Tensor, v: torch.Tensor, row: dict) -> tuple[torch.Tensor, torch.Tensor]:
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
        landmark_keys = self._layer_norm(torch.bmm(projection, k), "global", row)  # (rows, r, d)
        landmark_values = self._layer_norm(torch.bmm(projection, v), "global", row)  # (rows, r, d)
        return landmark_keys, landmark_values
